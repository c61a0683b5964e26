"""vime_ext/reports.py: the table printed, and with a path stem kept as OUT.md beside OUT.json."""

import json

from vime_ext.reports import report


def test_a_report_is_printed_and_kept_beside_its_figures(tmp_path, capsys):
    report("| a |\n|---|", {"a": 1}, tmp_path / "deep" / "table.v2")  # a stem with a dot keeps it
    assert capsys.readouterr().out == "| a |\n|---|\n"
    assert (tmp_path / "deep" / "table.v2.md").read_text() == "| a |\n|---|\n"  # one final newline
    assert json.loads((tmp_path / "deep" / "table.v2.json").read_text()) == {"a": 1}
    report("| b |\n", [], None)  # printed only
    assert capsys.readouterr().out == "| b |\n\n" and sorted(p.name for p in (tmp_path / "deep").iterdir()) == [
        "table.v2.json", "table.v2.md"]
