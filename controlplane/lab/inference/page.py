"""The one fake metrics page of the project: Prometheus text as vLLM writes it, for the
simulator's /metrics, the tests and the benchmarks (tools/bench-probe)."""

from __future__ import annotations

from dataclasses import dataclass

# (type, name, help, EngineStats field), in vLLM's names and words
VLLM_METRICS = (
    ("gauge", "vllm:num_requests_running", "Number of requests in model execution batches.", "running"),
    ("gauge", "vllm:num_requests_waiting", "Number of requests waiting to be processed.", "waiting"),
    ("gauge", "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv_usage"),
    ("counter", "vllm:prompt_tokens_total", "Number of prefill tokens processed.", "prompt_tokens"),
    ("counter", "vllm:generation_tokens_total", "Number of generation tokens processed.", "generation_tokens"),
    ("counter", "vllm:request_success_total", "Count of successfully processed requests.", "request_success"),
)
TTFT_BUCKETS = (
    "0.001",
    "0.005",
    "0.01",
    "0.02",
    "0.04",
    "0.06",
    "0.08",
    "0.1",
    "0.25",
    "0.5",
    "0.75",
    "1.0",
    "2.5",
    "5.0",
    "7.5",
    "10.0",
    "+Inf",
)


@dataclass(frozen=True)
class EngineStats:
    """One engine's numbers, as its page shows them."""

    running: float = 0
    waiting: float = 0
    kv_usage: float = 0.0
    prompt_tokens: float = 0
    generation_tokens: float = 0
    request_success: float = 0


def _label(text: str) -> str:
    return text.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")


def vllm_page(*engines: EngineStats, model: str = "llama", ttft_histogram: bool = False) -> str:
    """Prometheus text format 0.0.4 with vLLM's names: each metric's HELP and TYPE, then one
    sample per engine, labelled model_name (and engine="i" when there are several, as vLLM's
    data-parallel engines are). ttft_histogram adds vLLM's time-to-first-token histogram, a
    family the prober must skip, as real pages have many."""
    labels = [
        f'model_name="{_label(model)}"' + (f',engine="{i}"' if len(engines) > 1 else "") for i in range(len(engines))
    ]
    out = []
    for kind, name, text, attr in VLLM_METRICS:
        out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        out += [f"{name}{{{label}}} {getattr(stats, attr)}" for label, stats in zip(labels, engines)]
    if ttft_histogram:
        name = "vllm:time_to_first_token_seconds"
        out += [f"# HELP {name} Histogram of time to first token in seconds.", f"# TYPE {name} histogram"]
        for label in labels:
            total = 0
            for i, le in enumerate(TTFT_BUCKETS):
                total += i * 37
                out.append(f'{name}_bucket{{{label},le="{le}"}} {total}.0')
            out += [f"{name}_count{{{label}}} {total}.0", f"{name}_sum{{{label}}} 1234.5"]
    return "\n".join(out) + "\n"
