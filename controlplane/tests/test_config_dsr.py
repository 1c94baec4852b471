"""forwarding: dsr in the config: accepted where direct server return can work, refused with one
line naming the field where the router would need the replies it no longer sees."""

from __future__ import annotations

import pytest

from controlplane import abi
from controlplane.config import parse_config
from controlplane.tests.configstage import DELETE, edited, error_of, valid_doc


def test_forwarding_defaults_to_nat_and_takes_dsr():
    cfg = parse_config(edited(valid_doc(), {"services[1].forwarding": "dsr"}))
    assert [s.forwarding for s in cfg.services] == ["nat", "dsr", "nat"]


def test_dsr_keeps_heartbeats_and_probes():
    doc = edited(
        valid_doc(),
        {"services[0].forwarding": "dsr", "services[0].health.passive": DELETE, "services[0].weights.policy": "static"},
    )
    (chat, _, _) = parse_config(doc).services
    assert chat.health.heartbeat is not None and chat.health.probe is not None


@pytest.mark.parametrize(
    "edits, error",
    [
        ({"services[0].forwarding": "direct"}, "services[0].forwarding"),
        ({"services[0].forwarding": "dsr"}, "services[0].health.passive: not with forwarding dsr"),
        (
            {"services[0].forwarding": "dsr", "services[0].health.passive": DELETE},
            "services[0].weights.wire.enabled: must be false with forwarding dsr",
        ),
        ({"services[2].forwarding": "dsr"}, "services[2].backends[0].port: 9000 must be the service port 8000"),
    ],
)
def test_dsr_refuses_what_needs_replies(edits, error):
    message = error_of(edited(valid_doc(), edits))
    assert message.startswith(error) and "\n" not in message


def test_dsr_with_latency_inverse_and_wire_off_is_accepted():
    doc = edited(
        valid_doc(),
        {
            "services[0].forwarding": "dsr",
            "services[0].health.passive": DELETE,
            "services[0].weights.wire": {"enabled": False},
        },
    )
    assert parse_config(doc).services[0].forwarding == "dsr"


def test_the_dsr_flag_is_its_own_bit():
    assert abi.SVC_F_DSR not in (abi.SVC_F_HEARTBEAT, abi.SVC_F_PASSIVE)
