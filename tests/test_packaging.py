"""Packaging: the embedded default prior is package data found through importlib.resources (so
a wheel install finds it as an editable one does), pyproject.toml lists every subpackage, and
``nfc-dps --version`` prints ``nfc_dps.__version__``, the installed metadata's version.

.ci/run builds the wheel, installs it in a fresh venv and runs the demo from outside the checkout."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import nfc_dps
from nfc_dps.cli import main
from nfc_dps.priors import default
from nfc_dps.priors.default import ASSETS_PACKAGE, ENV_VAR, default_prior_path, load_prior, prior_identity

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


def test_the_default_prior_is_the_assets_package_data(no_env):
    from importlib import resources

    folder = default_prior_path()
    assert folder == resources.files(ASSETS_PACKAGE) / "default_prior"
    assert (folder / "nfc_dps_prior.json").is_file() and (folder / "unet" / "diffusion_pytorch_model.safetensors").is_file()
    assert prior_identity(None)["path"] == str(folder) and prior_identity(None)["embedded_default"]


def test_the_loader_asks_importlib_resources_not_a_path_beside_the_source(no_env, monkeypatch, tmp_path):
    """Wherever importlib.resources places nfc_dps._assets (site-packages in a wheel install), the
    default prior is read from there, not from a folder computed from this file's location."""
    asked = []

    def files(package):
        asked.append(package)
        return tmp_path

    monkeypatch.setattr(default.resources, "files", files)
    assert default_prior_path() == tmp_path / "default_prior" and asked == [ASSETS_PACKAGE]
    info = prior_identity(None)
    assert info["path"] == str(tmp_path / "default_prior") and info["files"] == {} and info["embedded_default"]
    with pytest.raises(FileNotFoundError, match="embedded default prior not found at .*default_prior"):
        load_prior()


def test_a_missing_assets_package_or_a_zipped_one_is_a_clear_error(no_env, monkeypatch):
    def missing(package):
        raise ModuleNotFoundError(f"No module named {package!r}")

    monkeypatch.setattr(default.resources, "files", missing)
    with pytest.raises(FileNotFoundError, match=rf"{ASSETS_PACKAGE} is not installed.*pip install -e \..*{ENV_VAR}"):
        load_prior()

    class ZipPath:  # a Traversable that is no folder on disk
        def __truediv__(self, name):
            return self

        def __str__(self):
            return "nfc_dps.zip/nfc_dps/_assets/default_prior"

    monkeypatch.setattr(default.resources, "files", lambda package: ZipPath())
    with pytest.raises(FileNotFoundError, match=rf"nfc_dps.zip/nfc_dps/_assets/default_prior\) is not a folder on disk.*{ENV_VAR}"):
        default_prior_path()


def test_the_environment_variable_still_names_another_prior(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    monkeypatch.setattr(default.resources, "files", lambda package: pytest.fail("importlib.resources asked despite the variable"))
    assert default_prior_path() == tmp_path and not prior_identity(None)["embedded_default"]


def test_pyproject_lists_every_subpackage_and_maps_assets():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    setuptools_cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "nfc_dps").rglob("__init__.py")}
    # assets/ and its data folders, named as setuptools sees them (nfc_dps._assets.default_prior, ...)
    found |= {".".join((ASSETS_PACKAGE, *p.relative_to(REPO / "assets").parts))
              for p in [REPO / "assets", *(REPO / "assets").rglob("*")] if p.is_dir() and p.name != "__pycache__"}
    listed = set(setuptools_cfg["packages"])
    assert found - listed == set(), f"pyproject.toml [tool.setuptools] packages misses {sorted(found - listed)}"
    assert listed - found == set(), f"pyproject.toml lists packages that do not exist: {sorted(listed - found)}"
    assert setuptools_cfg["package-dir"] == {ASSETS_PACKAGE: "assets"} and (REPO / "assets" / "__init__.py").is_file()
    assert setuptools_cfg["package-data"][ASSETS_PACKAGE] == ["default_prior/**/*"]


def test_version_is_the_installed_metadata_and_the_cli_prints_it(capsys):
    assert nfc_dps.__version__ == importlib.metadata.version("nfc_dps"), (
        "nfc_dps.__version__ differs from the installed metadata: reinstall (pip install -e .)")
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"nfc-dps {nfc_dps.__version__}\n"


def test_the_installed_console_script_prints_the_version():
    script = shutil.which("nfc-dps", path=sysconfig.get_path("scripts")) or shutil.which("nfc-dps")
    if script is None:
        pytest.skip("no nfc-dps console script installed (pip install -e . installs it)")
    out = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out == f"nfc-dps {nfc_dps.__version__}\n"
    assert subprocess.run([sys.executable, "-m", "nfc_dps", "--version"], capture_output=True, text=True, timeout=120,
                          check=True).stdout == out


def test_a_missing_folder_named_by_the_variable_is_named_and_an_empty_path_is_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "gone"))
    with pytest.raises(FileNotFoundError, match=rf"\${ENV_VAR}=.*gone: no such prior folder"):
        load_prior()
    monkeypatch.delenv(ENV_VAR)
    assert prior_identity("")["embedded_default"]
    monkeypatch.chdir(tmp_path)  # "" is the default prior, not the working folder
    assert load_prior("").channels == 3
