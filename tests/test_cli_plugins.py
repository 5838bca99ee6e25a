"""pydantic's plugins found without ``importlib.metadata`` (``commtax.cli.plugins``): only where no distribution can
declare one, the stand-in gone after the block, and a user's own plugin still loaded by the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest
from conftest import REPO

from commtax.cli import plugins

WORKED = REPO / "examples" / "llama2-70b-h100.yaml"


def dist_info(folder, name: str, entry_points: str | None):
    info = folder / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    if entry_points is not None:
        (info / "entry_points.txt").write_text(entry_points)
    return info


@pytest.fixture
def bare_path(tmp_path, monkeypatch):
    """``sys.path`` one folder of distributions without a pydantic entry point, and a missing folder."""
    site = tmp_path / "site"
    dist_info(site, "plain", None)
    dist_info(site, "scripts", "[console_scripts]\nscripts = scripts:main\n")
    (site / "old.egg-info").write_text("Name: old\n")  # an egg-info file: no entry points
    monkeypatch.setattr(sys, "path", [str(site), str(tmp_path / "missing")])
    return site


def test_no_distribution_declares_a_plugin(bare_path):
    assert plugins.may_declare_plugins() is False


@pytest.mark.parametrize("mention", ["[pydantic]\nmine = mine:plugin\n", "[console_scripts]\npydantic-x = x:main\n"])
def test_an_entry_point_that_mentions_pydantic_is_a_possible_plugin(bare_path, mention):
    dist_info(bare_path, "mine", mention)
    assert plugins.may_declare_plugins() is True


def test_what_the_check_cannot_read_is_a_possible_plugin(bare_path, tmp_path, monkeypatch):
    (dist_info(bare_path, "odd", None) / "entry_points.txt").mkdir()  # unreadable
    assert plugins.may_declare_plugins() is True
    (bare_path / "odd-0.1.dist-info" / "entry_points.txt").rmdir()
    assert plugins.may_declare_plugins() is False
    archive = tmp_path / "dists.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("z-0.1.dist-info/entry_points.txt", "[pydantic]\nz = z:plugin\n")
    for entry in (str(archive), str(tmp_path / "x.egg"), bare_path):  # a zip, an egg, a Path (not a string)
        monkeypatch.setattr(sys, "path", [str(bare_path), entry])
        assert plugins.may_declare_plugins() is True


def test_another_distribution_finder_is_a_possible_plugin(bare_path, monkeypatch):
    class Finder:
        @staticmethod
        def find_distributions(context=None):
            return iter(())

    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    assert plugins.may_declare_plugins() is True


def run_python(code: str, extra_path: str = "") -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), extra_path) if p)}
    env.pop("PYDANTIC_DISABLE_PLUGINS", None)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=True
    ).stdout


def test_within_the_block_pydantic_builds_models_without_importlib_metadata():
    """In a fresh interpreter (this environment declares no pydantic plugin): the stand-in answers, then is gone;
    the real loader, imported after, finds no plugin either; another of its names is the real module's."""
    code = """
import sys
from commtax.cli.plugins import LOADER, plugins_found_cheaply
with plugins_found_cheaply():
    import pydantic
    class M(pydantic.BaseModel):
        x: int
    print(M(x="3").x, "importlib.metadata" in sys.modules, sys.modules[LOADER].get_plugins())
print(LOADER in sys.modules)
from pydantic.plugin._loader import get_plugins
print(list(get_plugins()))
with plugins_found_cheaply():
    print(sys.modules[LOADER].get_plugins is get_plugins)  # the real module was imported: no stand-in
"""
    assert run_python(code).split("\n") == ["3 False ()", "False", "[]", "True", ""]
    code = """
import sys
from commtax.cli.plugins import LOADER, plugins_found_cheaply
with plugins_found_cheaply():
    print(sys.modules[LOADER].PYDANTIC_ENTRY_POINT_GROUP, sys.modules[LOADER].__name__ == LOADER)
    print(hasattr(sys.modules[LOADER], "_plugins"))
"""
    assert run_python(code).split("\n") == ["pydantic True", "True", ""]


PLUGIN = """
import os

class Plugin:
    def new_schema_validator(self, schema, schema_type, schema_type_path, schema_kind, config, plugin_settings):
        with open(os.environ["PLUGIN_SAW"], "a") as fh:
            fh.write(f"{schema_type_path.name}\\n")
        return None, None, None

plugin = Plugin()
"""


@pytest.mark.parametrize("command", [["estimate", WORKED, "--json"], ["cost", WORKED, "--json"]])
def test_a_users_plugin_is_still_loaded_by_the_cli(tmp_path, command):
    site = tmp_path / "site"
    dist_info(site, "sawplugin", "[pydantic]\nsaw = sawplugin:plugin\n")
    (site / "sawplugin.py").write_text(PLUGIN)
    saw = tmp_path / "saw.txt"
    runs = []
    for extra in ("", str(site)):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), extra) if p)}
        env["PLUGIN_SAW"] = str(saw)
        env.pop("PYDANTIC_DISABLE_PLUGINS", None)
        run = subprocess.run(
            [sys.executable, "-m", "commtax.cli", *map(str, command)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert run.returncode == 0, run.stderr
        runs.append(run.stdout)
    assert runs[0] == runs[1]
    assert "Job" in saw.read_text().split()  # the plugin saw the spec models built
