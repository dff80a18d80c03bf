"""Hardware a user names (nbtrain.hardware.named): the card table, the spec grammar, and what it refuses."""

from __future__ import annotations

import pytest

from nbtrain.hardware.named import CARDS, card, parse


@pytest.mark.parametrize(
    ("spec", "nodes", "per_node", "key"),
    [
        ("8xA100-40GB", 1, 8, "A100-40GB"),
        ("2x8xH100-80GB", 2, 8, "H100-80GB"),
        ("1xT4", 1, 1, "T4"),
        ("t4", 1, 1, "T4"),
        ("4 x rtx4090", 1, 4, "4090"),
        ("2*4*a100_80gb", 2, 4, "A100-80GB"),
    ],
)
def test_a_spec_names_nodes_cards_and_the_card(spec: str, nodes: int, per_node: int, key: str) -> None:
    t = parse(spec)
    assert (t.nodes, t.per_node, t.card and t.card.key) == (nodes, per_node, key)
    hw = t.hardware()
    assert len(hw.gpus) == per_node and hw.gpus[0].memory_total == t.card.gib * 2**30  # type: ignore[union-attr]


def test_every_card_has_its_facts_and_a_t4_has_no_bf16() -> None:
    assert {"T4", "L4", "A10G", "3090", "4090", "A100-40GB", "A100-80GB", "H100-80GB", "H200", "MI300X"} <= {
        c.key for c in CARDS
    }
    assert not card("T4").bf16 and card("A100-40GB").bf16 and card("H100").cc == (9, 0)
    assert "no bf16" in card("T4").words() and "no flash-attention" in card("T4").words()
    assert all(c.gib > 0 and c.tflops > 0 and c.ram_gib[0] <= c.ram_gib[1] for c in CARDS)


def test_a_mac_and_a_cpu_machine_are_named_too() -> None:
    mac = parse("M3-Max-64GB").hardware()
    assert mac.accelerator is not None and mac.accelerator.kind == "mps" and mac.ram_total == 64 * 2**30
    cpu = parse("cpu-16").hardware()
    assert cpu.cpu_count == 16 and not cpu.gpus and cpu.accelerator is None


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("8xA100", "A100-40GB or A100-80GB"),
        ("8xB200", "unknown card 'B200'; known: T4"),
        ("0xT4", "between 1 and 4096 nodes"),
        ("", "is not hardware nbtrain knows"),
        ("2xM2", "a Mac is one machine"),
    ],
)
def test_what_it_does_not_know_is_said_with_what_it_does(spec: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        parse(spec)
