"""Copy a wheel without some of its members, its RECORD rewritten to match (the carried wheels that are over a device
call's 64 MiB: fetch_gpu_wheels.sh, fetch_verl_wheels.sh).
    python3 tools/gpu/strip_wheel.py SRC DST PREFIX...
"""
import sys
import zipfile


def strip(src: str, dst: str, drop: tuple) -> None:
    """Copy the wheel `src` to `dst` without the members whose names start with one of `drop`."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if info.filename.startswith(drop):
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(line + b"\n" for line in data.splitlines()
                                if line and not line.decode().startswith(drop))
            zout.writestr(info, data)


if __name__ == "__main__":
    strip(sys.argv[1], sys.argv[2], tuple(sys.argv[3:]))
