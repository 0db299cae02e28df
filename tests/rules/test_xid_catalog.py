"""The shipped Xid catalog: valid, its derived lists, the committed docs/xid.md."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fleetwatch.rules import xids
from fleetwatch.rules.xids import CatalogError, parse_catalog, shipped_catalog

ROOT = Path(__file__).resolve().parents[2]
ENTRY = {
    "code": 48,
    "name": "ROBUST_CHANNEL_GPU_ECC_DBE",
    "bucket": "RESET_GPU",
    "action": "reset_gpu",
    "hardware": True,
    "description": "Double-bit ECC error.",
}


def catalog_text(*entries: dict[str, object]) -> str:
    return yaml.safe_dump({"xids": list(entries)})


def test_shipped_catalog_covers_the_xids_operators_meet() -> None:
    codes = {e.code for e in shipped_catalog().entries}
    assert {13, 31, 32, 38, 43, 45, 48, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95} <= codes
    assert {109, 119, 120, 121, 140, 143, *range(144, 151), 154} <= codes


def test_critical_list_is_every_reset_reboot_or_support_xid_but_79() -> None:
    catalog = shipped_catalog()
    critical = catalog.critical()
    assert {48, 62, 64, 95, 119, 120} <= set(critical)  # the hand-written list it replaces
    assert {74, 109, 140, 144, 149} <= set(critical)  # reset Xids that list missed
    assert 79 not in critical  # GPUFallenOffBus's
    assert not {13, 31, 43, 45, 63, 92, 94, 154} & set(critical)  # app restart or ignore
    assert critical == tuple(sorted(critical))


def test_rma_list_is_hardware_that_needs_a_reset() -> None:
    rma = shipped_catalog().rma()
    assert {48, 64, 95, 140} <= set(rma)  # the report's former list
    assert not {79, 94, 63, 92, 119} & set(rma)


def test_the_report_uses_the_derived_rma_list() -> None:
    from fleetwatch.report import actions as analysis

    assert set(analysis.RMA_XIDS) == {str(code) for code in shipped_catalog().rma()}


def test_committed_doc_matches_the_catalog() -> None:
    assert xids.main([str(ROOT / "docs" / "xid.md"), "--check"]) == 0


def test_check_mode_reports_drift(tmp_path: Path) -> None:
    stale = tmp_path / "xid.md"
    stale.write_text("# Xid catalog\n")
    assert xids.main([str(stale), "--check"]) == 1
    assert xids.main([str(stale)]) == 0
    assert xids.main([str(stale), "--check"]) == 0


def test_a_valid_catalog_parses_in_code_order() -> None:
    catalog = parse_catalog(catalog_text({**ENTRY, "code": 95}, ENTRY))
    assert [e.code for e in catalog.entries] == [48, 95]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("xids: [", "x.yaml: not valid YAML"),
        ("- 48", "x.yaml: expected a mapping with a list under 'xids'"),
        ("xids: [48]", "x.yaml: entry 0: expected a mapping"),
        (catalog_text({**ENTRY, "action": "pray"}), "entry 0 (xid 48): action: unknown action"),
        (catalog_text(ENTRY, ENTRY), "entry 1 (xid 48): duplicate code"),
        (
            catalog_text({k: v for k, v in ENTRY.items() if k != "bucket"}),
            "entry 0 (xid 48): missing key 'bucket'",
        ),
        (catalog_text({**ENTRY, "hardware": "yes"}), "entry 0 (xid 48): hardware: expected bool"),
        (catalog_text({**ENTRY, "code": True}), "entry 0: code: expected int"),
        (catalog_text({**ENTRY, "code": 0}), "entry 0 (xid 0): code: expected 1..999"),
        (catalog_text({**ENTRY, "name": " "}), "entry 0 (xid 48): name: must not be empty"),
        (catalog_text({**ENTRY, "severity": 1}), "entry 0 (xid 48): unknown key 'severity'"),
    ],
)
def test_a_malformed_catalog_names_file_entry_and_key(text: str, message: str) -> None:
    with pytest.raises(CatalogError) as raised:
        parse_catalog(text, source="x.yaml")
    assert str(raised.value).startswith("x.yaml: ")
    assert message in str(raised.value)
