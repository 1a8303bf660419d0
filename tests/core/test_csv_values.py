"""Data CSV values (issue 26 items 8 and 19): a row starting with ``#N/A`` was read as a comment
by numpy.loadtxt and silently dropped (the fit trained on the other rows, exit 0); a ragged row
was named by numpy's 0-based data-row count with its advice to use ``usecols``. Now the CSV has
no comments: the value that is not a number and the short or long row are named by file line
(the header is line 1) and column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ort_train_core.cli import load_table, main


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "data.csv"
    path.write_text(text, encoding="utf-8")
    return path


def test_na_row_is_named_not_dropped(tmp_path: Path) -> None:
    path = _write(tmp_path, "a,b,y\n1,2,3\n#N/A,5,6\n7,8,9\n")
    with pytest.raises(ValueError, match=r"line 3, column 'a': '#N/A' is not a number") as info:
        load_table(str(path), "y")
    assert "usecols" not in str(info.value)


def test_hash_inside_a_row_is_a_value(tmp_path: Path) -> None:
    path = _write(tmp_path, "a,b,y\n1,2,3\n4,#N/A,6\n")
    with pytest.raises(ValueError, match=r"line 3, column 'b': '#N/A' is not a number"):
        load_table(str(path), "y")


def test_rows_that_are_numbers_load_as_numpy_reads_them(tmp_path: Path) -> None:
    path = _write(tmp_path, "a,b,y\n1,2,3\n\n4.5,-5e3,nan\n7,8,9\n")
    X, y, names = load_table(str(path), "y")
    np.testing.assert_array_equal(X, [[1, 2], [4.5, -5e3], [7, 8]])
    np.testing.assert_array_equal(y, [3, np.nan, 9])
    assert names == ["a", "b"]


@pytest.mark.parametrize(
    ("row", "count"),
    [("4,5", 2), ("4,5,6,7", 4)],
)
def test_ragged_row_is_named_by_line(tmp_path: Path, row: str, count: int) -> None:
    path = _write(tmp_path, f"a,b,y\n1,2,3\n1,2,3\n{row}\n7,8,9\n")
    with pytest.raises(
        ValueError, match=rf"line 4 holds {count} values but the header names 3 columns"
    ) as info:
        load_table(str(path), "y")
    assert "usecols" not in str(info.value)


def test_cli_exit_2_names_the_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import onnx
    from core_models import build_linear

    onnx.save(build_linear(2), tmp_path / "m.onnx")
    path = _write(tmp_path, "a,b,y\n1,2,3\n#N/A,5,6\n7,8,9\n")
    out = tmp_path / "out.onnx"
    code = main(
        ["fit", str(tmp_path / "m.onnx"), "--data", str(path), "--target", "y", "--out", str(out), "--quiet"]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert "'#N/A' is not a number" in err
    assert not out.exists()
