#!/usr/bin/env python3
"""compare_builds.py on made-up sweeps: rows matched by class, shape and dtype,
failures left out, the figures by class and the moved rows."""
import contextlib
import io
import json
import math
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_builds  # noqa: E402


def row(cls, shape, dtype, ours_s, vendor_s=None, ok=True, variant="flash_mma"):
    r = {"class": cls, "shape": shape, "dtype": dtype, "ours_s": ours_s, "ok": ok,
         "variant": variant}
    if vendor_s is not None:
        r["vendor_s"] = vendor_s
    return r


class CompareBuildsTest(unittest.TestCase):
    def setUp(self):
        self.new = {"command": "new", "rows": [
            row("decode", "B1 H8 Sq1 Skv4096 D128", "bf16", 10e-6, 11e-6),
            row("decode", "B1 H8 Sq1 Skv4096 D128", "f16", 20e-6, 18e-6),
            row("square", "B4 H16 S2048 D64", "bf16", 100e-6, 120e-6, variant="flash_wgmma"),
            row("square", "B4 H16 S4096 D64", "bf16", 0.0, 300e-6, ok=False),
            row("square", "B1 H1 S128 D8", "bf16", 5e-6),  # no vendor time
            row("lse", "only in new", "bf16", 1e-6, 1e-6),
        ]}
        self.base = {"command": "base", "date": "2026-12-06T00:00:00Z", "rows": [
            row("decode", "B1 H8 Sq1 Skv4096 D128", "bf16", 12e-6),
            row("decode", "B1 H8 Sq1 Skv4096 D128", "f16", 20.2e-6),
            row("square", "B4 H16 S2048 D64", "bf16", 90e-6, variant="flash_mma"),
            row("square", "B4 H16 S4096 D64", "bf16", 250e-6),
            row("square", "B1 H1 S128 D8", "bf16", 5e-6),
        ]}

    def test_merge_matches_rows_and_leaves_out_failures(self):
        pairs, failed = compare_builds.merge(self.new, self.base)
        self.assertEqual(failed, 1)
        self.assertEqual(len(pairs), 4)
        rows = {(r["shape"], r["dtype"]): r for r in self.new["rows"]}
        first = rows[("B1 H8 Sq1 Skv4096 D128", "bf16")]
        self.assertAlmostEqual(first["base_s"], 12e-6)
        self.assertAlmostEqual(first["base_ratio"], 11.0 / 12.0)
        self.assertEqual(rows[("B4 H16 S2048 D64", "bf16")]["base_variant"], "flash_mma")
        self.assertNotIn("base_s", rows[("B4 H16 S4096 D64", "bf16")])
        self.assertNotIn("base_s", rows[("only in new", "bf16")])
        self.assertNotIn("base_ratio", rows[("B1 H1 S128 D8", "bf16")])
        self.assertEqual(self.new["base_command"], "base")

    def test_summary_by_class_and_over_all(self):
        pairs, _ = compare_builds.merge(self.new, self.base)
        table = {name: (n, fa, fb, time) for name, n, fa, fb, time in compare_builds.summary(pairs)}
        self.assertEqual(sorted(table), ["(all)", "decode", "square"])
        n, fa, fb, time = table["decode"]
        self.assertEqual(n, 2)
        self.assertAlmostEqual(fa[0], math.sqrt(1.1 * 0.9))
        self.assertAlmostEqual(fa[1], 0.9)
        self.assertEqual(fa[2:], (1, 0))
        self.assertAlmostEqual(fb[1], 18.0 / 20.2)
        self.assertEqual(fb[2], 0)
        self.assertAlmostEqual(time, math.sqrt(10.0 / 12.0 * 20.0 / 20.2))
        n, fa, fb, _ = table["square"]  # the row without a vendor time is left out
        self.assertEqual(n, 1)
        self.assertAlmostEqual(fb[0], 120.0 / 90.0)
        self.assertEqual(table["(all)"][0], 3)

    def test_command_line_writes_and_lists_moved_rows(self):
        with tempfile.TemporaryDirectory() as d:
            paths = [os.path.join(d, n) for n in ("new.json", "base.json", "out.json")]
            for path, doc in zip(paths, (self.new, self.base)):
                with open(path, "w") as f:
                    json.dump(doc, f)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = compare_builds.main([paths[0], paths[1], "--out", paths[2], "--moved",
                                          "0.05", "--names", "change,base"])
            self.assertEqual(rc, 0)
            text = out.getvalue()
            self.assertIn("4 rows timed by both builds, 1 failed in one of them", text)
            moved = text.split("rows whose time moved")[1].splitlines()[1:]
            # bf16 10 against 12 us and 100 against 90 us; not f16's 20 against 20.2 (1%).
            self.assertEqual(len(moved), 2, moved)
            self.assertEqual([line.split()[-7] for line in moved], ["bf16", "bf16"])
            self.assertIn("B1 H8 Sq1 Skv4096 D128", moved[0])
            self.assertIn("B4 H16 S2048 D64", moved[1])
            with open(paths[2]) as f:
                written = json.load(f)
            self.assertEqual(sum(1 for r in written["rows"] if "base_s" in r), 4)


if __name__ == "__main__":
    unittest.main()
