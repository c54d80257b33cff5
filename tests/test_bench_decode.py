"""winpos.bench.decode: PIL and OpenCV timed side by side on in-memory sets; the rows say whether the arrays are
equal (JPEG and 16-bit grey: yes; a 48-bit PNG: no, PIL keeps its high bytes) and --json follows the output policy."""
import json

from winpos.bench.decode import main


def test_decode_benchmark_rows_and_json(tmp_path, capsys):
    out = tmp_path / "decode.json"
    assert main(["--jpegs", "2", "--pngs", "1", "--rounds", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| JPEG 1024x768 q90 | 2 |" in text and "PIL / winpos" in text
    rows = {r["set"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["JPEG 1024x768 q90"]["same_array"] and rows["16-bit grey PNG 512x384"]["same_array"]
    assert not rows["48-bit colour PNG 512x384"]["same_array"]
    assert all(r["ratio_pil_over_winpos"] > 0 for r in rows.values())
    assert main(["--jpegs", "1", "--json", str(out)]) == 2  # an existing --json without --force
    assert "--force" in capsys.readouterr().err
