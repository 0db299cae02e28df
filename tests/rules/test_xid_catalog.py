"""The shipped Xid catalog: valid, its derived lists, the committed docs/xid.md."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleetwatch.catalog import nvidia_xids as xids
from fleetwatch.catalog.nvidia_xids import CatalogError, parse_catalog, shipped_catalog

ROOT = Path(__file__).resolve().parents[2]
ENTRY = {
    "code": 48,
    "name": "ROBUST_CHANNEL_GPU_ECC_DBE",
    "bucket": "RESET_GPU",
    "action": "reset_gpu",
    "hardware": True,
    "description": "Double-bit ECC error.",
}

RULE = {"xid": 144, "units": ["SAW_MVB"], "error_status": 1, "bucket": "IGNORE"}


def catalog_text(*entries: dict[str, object]) -> str:
    return yaml.safe_dump({"xids": list(entries)})


def test_shipped_catalog_covers_the_xids_operators_meet() -> None:
    codes = {e.code for e in shipped_catalog().entries}
    assert {13, 31, 32, 38, 43, 45, 48, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95} <= codes
    assert {109, 119, 120, 121, 140, 143, *range(144, 151), 154} <= codes


def test_shipped_catalog_holds_every_code_nvidia_gives_a_bucket() -> None:
    codes = {e.code for e in shipped_catalog().entries}
    assert {39, 40, 41, 54, 156, 157, 159, 160, 161} <= codes  # the missing ones
    assert set(range(70, 73)) | {75, 76, 77, 78, 80} | set(range(82, 87)) <= codes
    assert set(range(96, 108)) | set(range(126, 136)) | {139, 142} <= codes
    assert not {1, 14, 61, 108, 122, 152, 153} & codes  # "Unused" or no data-center GPU
    assert not set(range(162, 173)) & codes  # listed without a bucket
    assert len(codes) == 96


def test_shipped_buckets_mean_their_actions() -> None:
    by_code = {e.code: e for e in shipped_catalog().entries}
    assert (by_code[54].bucket, by_code[54].action) == ("CHECK_MECHANICALS", "check_mechanicals")
    assert (by_code[156].bucket, by_code[156].action) == ("RESET_GPU", "reset_gpu")
    assert (by_code[39].bucket, by_code[39].action) == ("RESTART_APP", "restart_application")
    assert (by_code[78].bucket, by_code[78].action) == ("UPDATE_SWFW", "update_software")
    assert {54, 156} <= set(shipped_catalog().critical())
    assert not {39, 78, 157} & set(shipped_catalog().critical())


@pytest.mark.parametrize(
    ("fields", "action"),
    [
        # Each sub-code and error status its own action (NVIDIA's XID 144-150 Decode).
        ({"xid": 144, "unit": "SAW_MVB", "error_status": 0x1}, "none"),
        ({"xid": 144, "unit": "SAW_MVB", "error_status": 0x2}, "reset_gpu"),
        ({"xid": 145, "unit": "RLW_REMAP", "error_status": 0x4}, "restart_application"),
        ({"xid": 145, "unit": "RLW_RXPIPE", "error_status": 0x2}, "none"),
        ({"xid": 145, "unit": "RLW_RXPIPE", "error_status": 0x2, "fatal": True}, "reset_gpu"),
        ({"xid": 146, "unit": "TLW_RX_PIPE1", "error_status": 0x4}, "reset_gpu"),
        ({"xid": 146, "unit": "TLW_RX", "error_status": 0x2}, "none"),
        ({"xid": 147, "unit": "TREX", "error_status": 0x80000000}, "none"),
        (
            {"xid": 149, "unit": "NETIR_LINK_DOWN", "intr_info": 0x0011, "error_status": 0},
            "reset_gpu",
        ),
        # Link-down reason 0b100110 (intrInfo bits 25:20): NVIDIA says ignore.
        ({"xid": 149, "unit": "NETIR_LINK_EVT", "intr_info": 0x026001C6}, "none"),
        ({"xid": 149, "unit": "NETIR_BER_EVENT", "error_status": 0x3}, "none"),
        ({"xid": 150, "unit": "MSE_WATCHDOG", "error_status": 0, "fatal": True}, "reset_gpu"),
        ({"xid": 144, "unit": "SAW_MVB", "error_status": 0x40}, None),  # no row: caller decides
        ({"xid": 144, "unit": "NO_SUCH_UNIT", "error_status": 0x1}, None),
    ],
)
def test_nvlink5_decode(fields: dict[str, object], action: str | None) -> None:
    arguments = {"fatal": False, "intr_info": 0, "error_status": 0, **fields}
    assert shipped_catalog().decode(**arguments) == action  # type: ignore[arg-type]


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
        (
            catalog_text({**ENTRY, "bucket": "PRAY"}),
            "entry 0 (xid 48): bucket: unknown bucket 'PRAY'",
        ),
        (
            catalog_text({**ENTRY, "action": "none"}),
            "entry 0 (xid 48): action: 'none' contradicts bucket RESET_GPU",
        ),
        (
            yaml.safe_dump({"xids": [ENTRY], "nvlink5_decode": [{**RULE, "xid": 151}]}),
            "nvlink5_decode entry 0: xid: the decode table is for Xids 144-150 only, got 151",
        ),
        (
            yaml.safe_dump({"xids": [ENTRY], "nvlink5_decode": [{**RULE, "bucket": "RESTART_BM"}]}),
            "nvlink5_decode entry 0: bucket: unknown bucket 'RESTART_BM'",
        ),
        (
            yaml.safe_dump({"xids": [ENTRY], "nvlink5_decode": [{**RULE, "error_status": -1}]}),
            "nvlink5_decode entry 0: error_status: expected null or an integer",
        ),
        (
            yaml.safe_dump({"xids": [ENTRY], "nvlink5_decode": [{**RULE, "units": []}]}),
            "nvlink5_decode entry 0: units: expected a list of unit names",
        ),
        (
            yaml.safe_dump({"xids": [ENTRY], "nvlink5_decode": [{**RULE, "note": "x"}]}),
            "nvlink5_decode entry 0: unknown key 'note'",
        ),
        (
            yaml.safe_dump({"xids": [ENTRY], "nvlink5_decode": {"xid": 144}}),
            "nvlink5_decode: expected a list",
        ),
    ],
)
def test_a_malformed_catalog_names_file_entry_and_key(text: str, message: str) -> None:
    with pytest.raises(CatalogError) as raised:
        parse_catalog(text, source="x.yaml")
    assert str(raised.value).startswith("x.yaml: ")
    assert message in str(raised.value)
