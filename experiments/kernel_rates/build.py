#!/usr/bin/env python3
"""Builds gemm_kernels.csv and conv_kernels.csv: measured GEMM and convolution kernel times by shape,
one row per published measurement.

Source: baidu-research/DeepBench at da81ba7820739e2e506dc27f382d15be5479f98f,
results/train/DeepBench_NV_V100.xlsx (last changed 2019-10-07 in 30c51150): sheets
"Results FP32" and "Results - FP16 ip, Mixed math" (16-bit inputs, 32-bit accumulate: tensor
cores), section "Dense Matrix Multiplication" (M, N, K, A/B transpose, time in ms). Its "Specs"
sheet: NVIDIA DGX-1 (V100 SXM2), CUDA 10.1.243, cuDNN 7.6.2, driver 418.67.

Usage: git -C DeepBench show da81ba78:results/train/DeepBench_NV_V100.xlsx > v100.xlsx
       python3 build.py v100.xlsx
The workbook is read with the standard library (an .xlsx is a zip of XML sheets). Rows whose time
cell is empty (the sheet's later DeepSpeech block gives only one number) are skipped; every kept
row's own TERAFLOPS column is checked against 2·M·N·K / time.
"""
import csv
import os
import sys
import xml.etree.ElementTree as ET
import zipfile

NS = {"m": "http://schemas.openxmlformats.org/spreadsheetml/2006/main"}
SOURCE = "baidu-research/DeepBench@da81ba7820739e2e506dc27f382d15be5479f98f"
FILE = "results/train/DeepBench_NV_V100.xlsx"
SHEETS = {"Results FP32": "fp32", "Results - FP16 ip, Mixed math": "fp16"}


def sheets(path):
    z = zipfile.ZipFile(path)
    strings = []
    if "xl/sharedStrings.xml" in z.namelist():
        for si in ET.fromstring(z.read("xl/sharedStrings.xml")).findall("m:si", NS):
            strings.append("".join(t.text or "" for t in si.iter("{%s}t" % NS["m"])))
    names = [s.get("name") for s in ET.fromstring(z.read("xl/workbook.xml")).find("m:sheets", NS)]
    for i, name in enumerate(names, 1):
        rows = []
        for row in ET.fromstring(z.read(f"xl/worksheets/sheet{i}.xml")).iter("{%s}row" % NS["m"]):
            cells = []
            for c in row.findall("m:c", NS):
                v = c.find("m:v", NS)
                text = v.text if v is not None else ""
                cells.append(strings[int(text)] if c.get("t") == "s" and text else text)
            rows.append((int(row.get("r")), cells))
        yield name, rows


def gemm_rows(path):
    for name, rows in sheets(path):
        if name not in SHEETS:
            continue
        section = None
        for r, cells in rows:
            if len(cells) > 1 and cells[1] == "M":
                section = cells[0]
                continue
            if section != "Dense Matrix Multiplication" or len(cells) < 8 or not cells[1].isdigit():
                continue
            if cells[4] not in ("N", "T") or cells[5] not in ("N", "T"):
                continue
            try:
                m, n, k = int(cells[1]), int(cells[2]), int(cells[3])
                ms, tflops = float(cells[6]), float(cells[7])
            except ValueError:
                continue
            assert abs(2 * m * n * k / (ms * 1e9) / tflops - 1) < 0.01, (name, r)
            yield {
                "id": f"deepbench-v100-{SHEETS[name]}-r{r}",
                "source": SOURCE,
                "locator": f"{FILE} sheet '{name}' row {r}",
                "gpu": "v100-16gb",
                "dtype": SHEETS[name],
                "app": cells[0],
                "m": m, "n": n, "k": k,
                "transpose": cells[4] + cells[5],
                "ms": cells[6],
            }


def conv_rows(path):
    """The forward convolutions: rows of the "Convolution" block whose forward time is a number."""
    for name, rows in sheets(path):
        if name not in SHEETS:
            continue
        section = None
        for r, cells in rows:
            if cells and cells[0] in ("Convolution", "Dense Matrix Multiplication") and not any(cells[1:]):
                section = cells[0]
                continue
            if section != "Convolution" or len(cells) < 13 or not cells[1].isdigit():
                continue
            try:
                w, h, c, n, k, s, rr, pw, ph, sw, sh = (int(x) for x in cells[1:12])
                ms = float(cells[12])
            except ValueError:
                continue
            yield {
                "id": f"deepbench-v100-conv-{SHEETS[name]}-r{r}",
                "source": SOURCE,
                "locator": f"{FILE} sheet '{name}' row {r}",
                "gpu": "v100-16gb",
                "dtype": SHEETS[name],
                "app": cells[0],
                "w": w, "h": h, "c": c, "n": n, "k": k, "s": s, "r": rr,
                "pad_w": pw, "pad_h": ph, "stride_w": sw, "stride_h": sh,
                "forward_ms": cells[12],
            }


def write(name, rows):
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"{len(rows)} rows -> {out}")


def main():
    write("gemm_kernels.csv", list(gemm_rows(sys.argv[1])))
    write("conv_kernels.csv", list(conv_rows(sys.argv[1])))


if __name__ == "__main__":
    main()
