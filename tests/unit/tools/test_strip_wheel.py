"""tools/gpu/strip_wheel.py: the members under the prefixes leave the wheel and its RECORD; the rest stay byte for
byte, and pip's view of the wheel (RECORD) still lists every member that is left."""
import importlib.util
import zipfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "gpu" / "strip_wheel.py"


def load_strip():
    spec = importlib.util.spec_from_file_location("strip_wheel", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.strip


def test_strip_drops_members_and_their_record_lines(tmp_path):
    members = {"pkg/__init__.py": b"x = 1\n", "pkg/jars/big.jar": b"J" * 100, "pkg/ui/build/a.js": b"js",
               "pkg/ui/serve.py": b"ok\n"}
    record = b"".join(f"{name},sha256=h,{len(data)}\n".encode() for name, data in members.items())
    src, dst = tmp_path / "pkg-1.0-py3-none-any.whl", tmp_path / "out.whl"
    with zipfile.ZipFile(src, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.writestr("pkg-1.0.dist-info/RECORD", record + b"pkg-1.0.dist-info/RECORD,,\n")
    load_strip()(str(src), str(dst), ("pkg/jars/", "pkg/ui/build/"))
    with zipfile.ZipFile(dst) as z:
        names = set(z.namelist())
        assert names == {"pkg/__init__.py", "pkg/ui/serve.py", "pkg-1.0.dist-info/RECORD"}
        assert z.read("pkg/ui/serve.py") == b"ok\n"
        listed = {line.split(",")[0] for line in z.read("pkg-1.0.dist-info/RECORD").decode().splitlines()}
    assert listed == names
