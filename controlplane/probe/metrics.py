"""The engines' metrics pages: the load signals (queue, running, KV-cache use, progress) read
from vLLM's, SGLang's and TGI's Prometheus text (parse_metrics), and the Load they make
(load_from). Pure."""

from __future__ import annotations

import math
from typing import Optional

from controlplane.samples import Load

# signal -> metric names, most preferred first; counters without their _total suffix
SIGNALS: dict[str, tuple[str, ...]] = {
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size"),
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "progress": (
        "vllm:generation_tokens",
        "vllm:request_success",
        "sglang:generation_tokens",
        "sglang:num_requests",
        "tgi_request_success",
    ),
}
# kv_usage is a fraction per engine: several label sets (data-parallel engines) take the
# fullest, since a sum could pass 1. Every other signal is summed over its label sets.
_MAX_NAMES = frozenset(SIGNALS["kv_usage"])
_ENGINES = tuple(
    (
        ("\n" + prefix).encode(),
        tuple(
            (n, ("\n" + n).encode())
            for n in dict.fromkeys(n for names in SIGNALS.values() for n in names if n.startswith(prefix))
        ),
    )
    for prefix in ("vllm:", "sglang:", "tgi_")
)


class MetricsError(ValueError):
    """The page holds none of the engine metrics of SIGNALS."""


def parse_metrics(body: bytes) -> dict[str, float]:
    """Each known metric of a Prometheus text page, summed over its label sets (kv_usage
    names: the maximum); keys are the names of SIGNALS (no _total).

    Only lines that start with a known name are read: a search for each engine's prefix,
    then for each of its names, whose lines are then read while they follow one another (the
    exposition format keeps a family's lines together). A value that is not a finite number
    (NaN, garbage) is skipped. Raises MetricsError when no known metric has a value.
    """
    text = b"\n" + body
    found: dict[str, float] = {}
    for prefix, needles in _ENGINES:
        if prefix not in text:
            continue
        for name, needle in needles:
            at = text.find(needle)
            taken = False
            while at >= 0:
                start = at + len(needle)
                end = text.find(b"\n", start)
                if end < 0:
                    end = len(text)
                value = _sample_value(text, start, end)
                if value is not None:
                    taken = True
                    if name not in found:
                        found[name] = value
                    elif name in _MAX_NAMES:
                        found[name] = max(found[name], value)
                    else:
                        found[name] += value
                if text.startswith(needle, end):
                    at = end  # the family's next line
                else:  # the family ends here; a group of look-alikes only (name_by_x) does not count
                    at = -1 if taken else text.find(needle, end)
    if not found:
        raise MetricsError("no engine metrics")
    return found


def _sample_value(text: bytes, start: int, end: int) -> Optional[float]:
    """The value of the line text[:end] whose metric name (so far) ends at start; None when
    the name goes on (another metric) or the value is not a finite number."""
    if text.startswith(b"_total", start):
        start += 6
    if start >= end:
        return None
    c = text[start]
    if c == 0x7B:  # '{': label values may hold '}' and spaces, but nothing after the block can
        close = text.rfind(b"}", start, end)
        if close < 0:
            return None
        start = close + 1
    elif c != 0x20 and c != 0x09:
        return None
    parts = text[start:end].split()  # value [timestamp]
    if not parts:
        return None
    try:
        value = float(parts[0])
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def load_from(found: dict[str, float], t_ns: int) -> Load:
    """A Load from parse_metrics' result: each signal from the first of its names found."""
    values = []
    for names in _SIGNAL_NAMES:
        for name in names:
            if name in found:
                values.append(found[name])
                break
        else:
            values.append(None)
    waiting, running, kv_usage, progress = values
    return Load(t_ns, True, waiting, running, kv_usage, progress)


_SIGNAL_NAMES = tuple(SIGNALS[s] for s in ("waiting", "running", "kv_usage", "progress"))
