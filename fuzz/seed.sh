#!/usr/bin/env bash
# Writes fuzz seeds into fuzz/corpus/<target>/:
#   shard_reader   the committed shard vectors, joined (proto/vectors/shard/v1-basic)
#   control_frame  every frame of proto/vectors/control/{frames,bad_frames}.json
#   tar_scan       small WebDataset tars in the ustar, GNU and pax dialects (Python tarfile)
#   image_decode   small JPEGs and PNGs (colour, gray, progressive, restart markers, palette,
#                  EXIF-rotated),
#                  written with Pillow (python3 -m pip install pillow)
# The stable smoke test (fuzz/tests/smoke.rs) builds the same kinds of seeds in memory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
v="$here/../proto/vectors/shard/v1-basic"
mkdir -p "$here/corpus/shard_reader" "$here/corpus/control_frame" "$here/corpus/image_decode"
sep=$'\n--ringfeed-fuzz-file--\n'
{ cat "$v/index.rfi"; printf '%s' "$sep"; cat "$v/shard-000000.rfs"; printf '%s' "$sep"; cat "$v/shard-000001.rfs"; } \
  > "$here/corpus/shard_reader/v1-basic"
echo "seeded $here/corpus/shard_reader"

python3 - "$here/../proto/vectors/control" "$here/corpus/control_frame" <<'PY'
import json, pathlib, re, sys
src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
n = 0
for f in ("frames.json", "bad_frames.json"):
    for case in json.loads((src / f).read_text()):
        name = re.sub(r"[^a-z0-9]+", "-", case["name"].lower()).strip("-")
        (out / f"{f.split('.')[0]}-{name}").write_bytes(bytes.fromhex(case["frame"]))
        n += 1
print(f"seeded {out} ({n} frames)")
PY

python3 - "$here/corpus/image_decode" <<'PY' || echo "image_decode: no seeds written (needs python3 with Pillow)"
import io, pathlib, sys
from PIL import Image
out = pathlib.Path(sys.argv[1])
def pic(mode, w, h):
    im = Image.new("RGB", (w, h))
    im.putdata([((x * 7) % 256, (y * 5) % 256, ((x + y) * 3) % 256) for y in range(h) for x in range(w)])
    return im.convert(mode)
n = 0
for w, h in ((1, 1), (17, 9), (64, 48), (200, 150)):
    for name, mode, fmt, kw in (
        ("rgb", "RGB", "JPEG", {"quality": 85}),
        ("gray", "L", "JPEG", {"quality": 70}),
        ("prog", "RGB", "JPEG", {"quality": 80, "progressive": True}),
        ("sub444", "RGB", "JPEG", {"quality": 90, "subsampling": 0}),
        ("restart", "RGB", "JPEG", {"quality": 85, "restart_marker_blocks": 1}),
        ("cmyk", "CMYK", "JPEG", {"quality": 80}),
        ("rgb", "RGB", "PNG", {}),
        ("rgba", "RGBA", "PNG", {}),
        ("pal", "P", "PNG", {}),
        ("gray", "L", "PNG", {}),
    ):
        buf = io.BytesIO()
        im = pic(mode, w, h)
        if fmt == "JPEG" and name == "rgb" and w > 1:
            exif = Image.Exif(); exif[0x0112] = 6  # EXIF orientation: rotate 90
            kw = dict(kw, exif=exif.tobytes())
        im.save(buf, fmt, **kw)
        (out / f"{name}-{w}x{h}.{fmt.lower()}").write_bytes(buf.getvalue())
        n += 1
print(f"seeded {out} ({n} images)")
PY

# tar_scan: WebDataset-layout tars written by Python's tarfile (ustar, GNU and pax headers).
mkdir -p "$here/corpus/tar_scan"
python3 - "$here/corpus/tar_scan" <<'PY'
import io, pathlib, sys, tarfile
out = pathlib.Path(sys.argv[1])
for fmt, name in ((tarfile.USTAR_FORMAT, "ustar"), (tarfile.GNU_FORMAT, "gnu"), (tarfile.PAX_FORMAT, "pax")):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for k, key in enumerate(["a", "d" * (40 if fmt == tarfile.USTAR_FORMAT else 130)]):
            for ext, data in (("jpg", b"\xff\xd8" + bytes(600)), ("cls", str(k).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    (out / name).write_bytes(buf.getvalue())
print(f"seeded {out} (3 tars)")
PY
