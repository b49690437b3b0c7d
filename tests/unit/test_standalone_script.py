"""./scripts/standalone runs scripts/setup only when needed: the first time, after a build
input changes (pyproject.toml, setup.py, scripts/setup, a Cython source), when .venv has no
working bk, or with BK_SETUP=1; setup's output is shown only when it fails. Run on a copy
of the script in a scratch tree whose scripts/setup, .venv/bin/python and .venv/bin/bk are
stand-ins that record their calls.
"""
import os
import shutil
import stat
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def executable(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def tree(tmp_path, setup_body='echo "setup: kernels x"; echo noise-from-pip; echo "$0" >> "$CALLS"'):
    (tmp_path / "scripts").mkdir()
    shutil.copy(os.path.join(ROOT, "scripts", "standalone"), tmp_path / "scripts" / "standalone")
    executable(tmp_path / "scripts" / "setup", f"#!/usr/bin/env bash\n{setup_body}\n")
    executable(tmp_path / ".venv" / "bin" / "python", "#!/usr/bin/env bash\nexit 0\n")
    executable(tmp_path / ".venv" / "bin" / "bk", '#!/usr/bin/env bash\necho "bk $*"\n')
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "bk" / "_native").mkdir(parents=True)
    (tmp_path / "bk" / "_native" / "_k.pyx").write_text("# v1\n")
    return tmp_path


def standalone(root, **env):
    calls = root / "calls"
    full = {**os.environ, "CALLS": str(calls), **env}
    out = subprocess.run([str(root / "scripts" / "standalone"), "--help"], capture_output=True, text=True,
                         env=full, timeout=60)
    n = len(calls.read_text().splitlines()) if calls.exists() else 0
    return out, n


def test_setup_runs_once_then_only_when_a_build_input_changes(tmp_path):
    root = tree(tmp_path)
    out, n = standalone(root)
    assert out.returncode == 0 and out.stdout == "bk standalone --help\n" and n == 1
    assert "setup: kernels x" in out.stderr and "noise-from-pip" not in out.stderr
    out, n = standalone(root)
    assert out.returncode == 0 and n == 1 and out.stderr == ""  # up to date: straight to bk
    (root / "bk" / "_native" / "_k.pyx").write_text("# v2\n")
    assert standalone(root)[1] == 2
    assert standalone(root)[1] == 2
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert standalone(root)[1] == 3
    assert standalone(root, BK_SETUP="1")[1] == 4
    (root / ".venv" / "bin" / "bk").unlink()
    executable(root / ".venv" / "bin" / "bk", '#!/usr/bin/env bash\necho "bk $*"\n')
    executable(root / ".venv" / "bin" / "python", "#!/usr/bin/env bash\nexit 1\n")  # bk does not import
    assert standalone(root)[1] == 5


def test_a_failed_setup_shows_its_output_and_stops(tmp_path):
    root = tree(tmp_path, setup_body='echo "pip: error: no network"; exit 3')
    out, _ = standalone(root)
    assert out.returncode == 1 and "pip: error: no network" in out.stderr and "bk standalone" not in out.stdout
    assert not (root / ".venv" / ".bk-setup-stamp").exists()
