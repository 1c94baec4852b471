"""What a config change changes, as an operator reads it: services added, removed or changed
(VIP, port, protocol, existing_flows, new_flows, health, weights policy), backends added and removed, and
configured weights changed. Used by edged's reload summary and by `edgectl diff`. Pure: configs
or status snapshots in, plain data out.

Both sides are first brought to one shape, {service: {"vip": "198.18.0.1:80/tcp", "settings":
{...}, "backends": {name: {"address": ..., "weight": ..., "standby": ...}}}}, so a config can be
compared with another config or with what a router runs (its status snapshot, which has no
health or policy settings: those are then not compared)."""

from __future__ import annotations

from dataclasses import asdict

KEYS = ("added_services", "removed_services", "updated_services", "added_backends", "removed_backends", "weights")


def shape_of_config(cfg) -> dict[str, dict]:
    """The comparable shape of a Config."""
    out = {}
    for s in cfg.services:
        settings = {
            "existing_flows": s.existing_flows,
            "new_flows": s.new_flows,
            "health": asdict(s.health) if s.health else None,
            "weights": asdict(s.weights),
        }
        out[s.name] = {
            "vip": f"{s.vip}:{s.port}/{s.protocol}",
            "settings": settings,
            "backends": {
                b.name: {"address": f"{b.address}:{b.port}", "weight": b.weight, "standby": b.standby}
                for b in s.backends
            },
        }
    return out


def _configured_weight(b: dict) -> int:
    edged = (b.get("edged") or {}).get("config_weight")
    return edged if edged is not None else b["probe"]["config_weight"]


def shape_of_status(snaps: list[dict]) -> dict[str, dict]:
    """The comparable shape of what runs, from `edgectl status --json` snapshots."""
    out = {}
    for snap in snaps:
        for s in snap["services"]:
            out[s["name"]] = {
                "vip": f"{s['vip']}:{s['port']}/{s['protocol']}",
                "settings": {"existing_flows": s["existing_flows"]},
                "backends": {
                    b["name"]: {
                        "address": f"{b['address']}:{b['port']}",
                        "weight": _configured_weight(b),
                        "standby": b["standby"],
                    }
                    for b in s["backends"]
                },
            }
    return out


def _service_changes(old: dict, new: dict) -> list[str]:
    """What changed in one service's own settings, e.g. ['vip 198.18.0.1:80/tcp -> 198.18.0.2:80/tcp']."""
    out = [f"vip {old['vip']} -> {new['vip']}"] if old["vip"] != new["vip"] else []
    for key, value in new["settings"].items():
        if key in old["settings"] and old["settings"][key] != value:
            out.append(key if isinstance(value, dict) or value is None else f"{key} {old['settings'][key]} -> {value}")
    return out


def _backend_changes(name: str, old: dict, new: dict, out: dict) -> None:
    for b in sorted(new.keys() - old.keys()):
        out["added_backends"].append(f"{name}/{b}")
    for b in sorted(old.keys() - new.keys()):
        out["removed_backends"].append(f"{name}/{b}")
    for b in sorted(new.keys() & old.keys()):
        was, now = old[b], new[b]
        if was["weight"] != now["weight"]:
            out["weights"].append(f"{name}/{b} {was['weight']} -> {now['weight']}")
        moved = [k for k in ("address", "standby") if was[k] != now[k]]
        if moved:
            out["updated_services"].append(f"{name}/{b}: " + ", ".join(f"{k} {was[k]} -> {now[k]}" for k in moved))


def diff(old: dict[str, dict], new: dict[str, dict]) -> dict[str, list[str]]:
    """What turning old into new changes (shapes of shape_of_config/shape_of_status), every list
    sorted; all empty when nothing does."""
    out: dict[str, list[str]] = {key: [] for key in KEYS}
    out["added_services"] = sorted(new.keys() - old.keys())
    out["removed_services"] = sorted(old.keys() - new.keys())
    for name in sorted(new.keys() & old.keys()):
        changes = _service_changes(old[name], new[name])
        if changes:
            out["updated_services"].append(f"{name}: {', '.join(changes)}")
        _backend_changes(name, old[name]["backends"], new[name]["backends"], out)
    return out


def changed(d: dict[str, list[str]]) -> bool:
    return any(d.values())


LABELS = (
    ("added_services", "services added"),
    ("removed_services", "services removed"),
    ("updated_services", "services changed"),
    ("added_backends", "backends added"),
    ("removed_backends", "backends removed"),
    ("weights", "weights"),
)


def describe(d: dict[str, list[str]]) -> list[str]:
    """One line per kind of change, e.g. 'weights: chat/b0 1 -> 2'."""
    return [f"{label}: {'; '.join(d[key])}" for key, label in LABELS if d.get(key)]
