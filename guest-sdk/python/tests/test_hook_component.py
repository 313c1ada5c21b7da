"""A real build: ``scripts/python-module.sh hook`` makes a component of the ``hook`` world from the
unchanged sample hook (componentize-py, ~10 s). The component's world is read from its binary
(the top-level import and export sections of the component model's encoding)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "python-module.sh"
HOOKS = Path(__file__).parent / "hooks"
PREAMBLE = b"\0asm\x0d\x00\x01\x00"  # a component, not a core module
IMPORT_SECTION, EXPORT_SECTION = 10, 11


def build(hook: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "hook", str(hook), str(out)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("hook-build") / "configmaps.wasm"
    done = build(HOOKS / "configmaps.py", out)
    assert done.returncode == 0, done.stderr
    return out, done.stderr


def _u32(data: bytes, i: int):
    """The LEB128 number at ``i`` and the offset after it."""
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _name(data: bytes, i: int):
    """An import or export name (0x00 name, or 0x01 name and version suffix)."""
    versioned = data[i] == 0x01
    n, i = _u32(data, i + 1)
    name = data[i:i + n].decode()
    i += n
    if versioned:
        n, i = _u32(data, i)
        i += n
    return name, i


def _externdesc(data: bytes, i: int) -> int:
    """The offset after the extern descriptor at ``i``."""
    kind = data[i]
    if kind == 0x00:  # core module: 0x11 and a type index
        return _u32(data, i + 2)[1]
    if kind == 0x03 and data[i + 1] == 0x01:  # a resource type: no index
        return i + 2
    if kind in (0x02, 0x03):  # value or type bound: its kind, then an index or a value type
        return _u32(data, i + 2)[1]
    return _u32(data, i + 1)[1]  # func, component, instance: a type index


def world_of(data: bytes):
    """The names the component imports and exports at its top level."""
    assert data[:8] == PREAMBLE, data[:8]
    names = {IMPORT_SECTION: [], EXPORT_SECTION: []}
    i = 8
    while i < len(data):
        section = data[i]
        size, i = _u32(data, i + 1)
        if section in names:
            count, j = _u32(data, i)
            for _ in range(count):
                name, j = _name(data, j)
                if section == EXPORT_SECTION:
                    j = _u32(data, j + (2 if data[j] == 0x00 else 1))[1]  # sort and index
                    j = _externdesc(data, j + 1) if data[j] == 0x01 else j + 1  # optional type
                else:
                    j = _externdesc(data, j)
                names[section].append(name)
            assert j == i + size, f"section {section} read to {j}, ends at {i + size}"
        i += size
    return names[IMPORT_SECTION], names[EXPORT_SECTION]


def test_an_unchanged_hook_file_builds_into_a_component_of_the_hook_world(built):
    out, stderr = built
    assert "from the hook" in stderr and f"built {out}" in stderr, stderr
    imports, exports = world_of(out.read_bytes())
    assert "wasmop:reconciler/hooks@0.1.0" in exports
    assert "wasmop:reconciler/guest@0.1.0" not in exports
    assert [n for n in imports if n.startswith("wasmop:")] == ["wasmop:reconciler/host@0.1.0"]
    assert all(n.startswith("wasi:") for n in imports if not n.startswith("wasmop:")), imports


def test_a_build_of_the_same_inputs_is_skipped(built, tmp_path):
    out, _ = built
    again = build(HOOKS / "configmaps.py", out)
    assert again.returncode == 0 and "is up to date" in again.stderr, again.stderr


def test_a_hook_named_like_a_standard_module_is_refused(tmp_path):
    hook = tmp_path / "json.py"
    shutil.copy(HOOKS / "configmaps.py", hook)
    refused = build(hook, tmp_path / "json.wasm")
    assert refused.returncode == 1 and "the name of a standard module" in refused.stderr, refused.stderr
    assert not (tmp_path / "json.wasm").exists()
