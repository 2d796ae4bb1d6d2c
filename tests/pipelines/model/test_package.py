"""A model package (``package.json`` + ``weights.pt``) rebuilds its predictor without MLflow or
Ray, and its weights file runs no code."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from pipelines.model.package import load_predictor, write_package
from tests.pipelines.helpers import esol_smiles, untrained_esol

from tests.pipelines.helpers import REPO  # noqa: E402


def test_a_package_predicts_in_a_process_that_imports_neither_mlflow_nor_ray(tmp_path, data_dir):
    """What a batch-inference actor does (``pipelines.model.stored.predictor_of``): the
    predictor is rebuilt and predicts, and neither MLflow nor Ray was imported for it (an
    actor's start would pay for both)."""
    exp, cfg, mc, model = untrained_esol()
    pkg = tmp_path / "pkg"
    write_package(str(pkg), exp, cfg, mc, model.state_dict())
    smiles = esol_smiles(data_dir, 3) + ["C1CC"]
    code = ("import json, os, sys; from pipelines.model.stored import PackageFiles, predictor_of; "
            "d = sys.argv[1]; read = lambda n: open(os.path.join(d, n), 'rb').read(); "
            "p = predictor_of(PackageFiles(read('package.json'), read('weights.pt'), d)); "
            "out = p.predict(json.loads(sys.argv[2])); "
            "print(json.dumps({'mods': sorted(m for m in ('mlflow', 'ray') if m in sys.modules), "
            "'errors': out['error'].isna().tolist(), 'col': p.input_column}))")
    res = subprocess.run([sys.executable, "-c", code, str(pkg), json.dumps(smiles)], capture_output=True, text=True,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == {"mods": [], "errors": [True, True, True, False], "col": "smiles"}


def test_crafted_weights_run_no_code(tmp_path):
    """A weights.pt whose unpickling would run code is refused, naming the file; nothing runs."""
    exp, cfg, mc, model = untrained_esol()
    pkg = tmp_path / "pkg"
    write_package(str(pkg), exp, cfg, mc, model.state_dict())
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"w": Evil()}, pkg / "weights.pt")
    with pytest.raises(ValueError, match="weights.pt"):
        load_predictor(str(pkg))
    assert not marker.exists()


def test_a_package_naming_an_unregistered_module_is_refused_without_importing_it(tmp_path, monkeypatch):
    """``package.json`` names the experiment class; only registered classes are imported (importing
    an arbitrary module can run its code)."""
    import json
    import sys

    from pipelines.model.package import EXPERIMENTS_ENV, PACKAGE_FILE, load_predictor

    marker = tmp_path / "imported"
    (tmp_path / "evil_module.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nclass Exp: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    pkg = tmp_path / "package"
    pkg.mkdir()
    (pkg / PACKAGE_FILE).write_text(json.dumps({"experiment": "evil_module.Exp", "config": {}, "model_context": {}}))
    torch.save({}, pkg / "weights.pt")
    with pytest.raises(ValueError, match=r"experiment 'evil_module.Exp' is not a registered experiment class"):
        load_predictor(str(pkg))
    assert not marker.exists() and "evil_module" not in sys.modules
    monkeypatch.setenv(EXPERIMENTS_ENV, "evil_module.Exp")        # the operator trusts it: now it is imported
    with pytest.raises(AttributeError):
        load_predictor(str(pkg))
    assert marker.exists()


def test_a_deeply_nested_package_description_is_a_named_error(tmp_path):
    from pipelines.model.package import PACKAGE_FILE, load_predictor

    pkg = tmp_path / "package"
    pkg.mkdir()
    (pkg / PACKAGE_FILE).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"package.json: not a package description \(JSON nested 100000 levels deep \(at most 200 allowed\)\)"):
        load_predictor(str(pkg))


def test_a_config_that_does_not_fit_the_weights_is_refused_before_it_is_built(tmp_path):
    """A crafted package.json asking for a model far larger than its weights is a ValueError naming
    the package and the mismatch, found on the meta device: the process's memory does not grow
    by the model's size (here ~4 GB of float32 weights asked for)."""
    import resource

    exp, cfg, mc, model = untrained_esol()
    pkg = tmp_path / "pkg"
    write_package(str(pkg), exp, cfg, mc, model.state_dict())
    desc = json.loads((pkg / "package.json").read_text())
    desc["config"]["molecules"]["atom_hidden"] = 30000       # f_a: Linear(60000, 30000), ~7 GB
    (pkg / "package.json").write_text(json.dumps(desc))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ValueError, match=r"package.json: the weights do not fit .*size mismatch"):
        load_predictor(str(pkg))
    grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grew_mb < 500, grew_mb
    desc["config"]["molecules"]["atom_hidden"] = cfg["molecules"]["atom_hidden"]
    (pkg / "package.json").write_text(json.dumps(desc))
    assert load_predictor(str(pkg)) is not None            # the honest package still loads


def test_an_sst_package_asking_for_a_larger_state_is_refused_before_it_is_built(tmp_path, data_dir):
    from tests.pipelines.helpers import untrained_sst

    exp, cfg, mc, model, _ = untrained_sst(data_dir)
    pkg = tmp_path / "pkg"
    write_package(str(pkg), exp, cfg, mc, model.state_dict())
    desc = json.loads((pkg / "package.json").read_text())
    desc["config"]["sst"]["state_size"] = 3000
    (pkg / "package.json").write_text(json.dumps(desc))
    with pytest.raises(ValueError, match=r"the weights do not fit .*size mismatch for"):
        load_predictor(str(pkg))
