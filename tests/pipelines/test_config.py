"""pipelines.config: YAML + overrides + schema validation + CLI helper."""
from __future__ import annotations

import pytest

from pipelines.config import (BASE_SCHEMA, ConfigError, Field, flatten, load_config, merged_schema,
                              parse_cli, validate)

SCHEMA = merged_schema({"model.hidden": Field(int, 64, min=1), "model.dropout": Field(float, 0.0, min=0, max=1),
                        "model.cell": Field(str, "lstm", choices=("lstm", "gru")),
                        "model.extra": Field(dict, {})})


def _write(tmp_path, text, name="exp.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_defaults_fill_every_base_key():
    cfg = load_config(None)
    flat = flatten(cfg, stop_at=[k for k, f in BASE_SCHEMA.items() if f.type is dict])
    assert set(flat) == set(BASE_SCHEMA)
    assert cfg["optimizer"]["name"] == "adam" and cfg["tracking"]["mode"] == "required"


def test_yaml_and_typed_overrides(tmp_path):
    p = _write(tmp_path, "name: sst\nepochs: 5\noptimizer:\n  name: adagrad\n  lr: 0.05\n"
                         "model:\n  hidden: 150\n  extra: {anything: [1, 2]}\n")
    cfg = load_config(p, ["optimizer.lr=1e-2", "model.hidden=300", "ray.use_gpu=true",
                          "eval_batch_size=null", "name=123", "optimizer.kwargs={eps: 1.0e-6}",
                          "ray.cpus_per_worker=1"], SCHEMA)
    assert cfg["optimizer"] == {**cfg["optimizer"], "name": "adagrad", "lr": 0.01}
    assert cfg["model"]["hidden"] == 300 and cfg["ray"]["use_gpu"] is True
    assert cfg["name"] == "123"  # str keys stay strings
    assert cfg["eval_batch_size"] is None
    assert cfg["optimizer"]["kwargs"] == {"eps": 1e-6}
    assert cfg["ray"]["cpus_per_worker"] == 1.0 and isinstance(cfg["ray"]["cpus_per_worker"], float)
    assert cfg["model"]["extra"] == {"anything": [1, 2]}  # free-form subtree kept as is
    assert cfg["epochs"] == 5 and cfg["model"]["cell"] == "lstm"


def test_unknown_key_in_file_names_key_and_file(tmp_path):
    p = _write(tmp_path, "optimizer:\n  lr: 0.1\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError) as e:
        load_config(p, schema=SCHEMA)
    assert e.value.key == "optimizer.learning_rate"
    assert "optimizer.learning_rate" in str(e.value) and str(p) in str(e.value)


def test_unknown_override_key_is_named(tmp_path):
    p = _write(tmp_path, "epochs: 2\n")
    with pytest.raises(ConfigError, match=r"model\.hiden.*did you mean|model\.hiden") as e:
        load_config(p, ["model.hiden=3"], SCHEMA)
    assert e.value.key == "model.hiden" and "command line" in str(e.value)


@pytest.mark.parametrize("override,key", [
    ("epochs=0", "epochs"),                 # below min
    ("epochs=2.5", "epochs"),               # float for int
    ("epochs=true", "epochs"),              # bool is not an int
    ("model.dropout=1.5", "model.dropout"),  # above max
    ("model.cell=rnn", "model.cell"),        # not a choice
    ("optimizer.name=lbfgs", "optimizer.name"),
    ("ray.use_gpu=maybe", "ray.use_gpu"),
    ("seed=null", "seed"),                  # not nullable
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override], SCHEMA)
    assert e.value.key == key and repr(key) in str(e.value)


def test_bad_override_syntax_and_yaml(tmp_path):
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["epochs"], SCHEMA)
    p = _write(tmp_path, "epochs: [1,\n")
    with pytest.raises(ConfigError, match="invalid YAML") as e:
        load_config(p, schema=SCHEMA)
    assert str(p) in str(e.value)


def test_required_field_and_tracking_shorthand(tmp_path):
    schema = merged_schema({"data.path": Field(str)})
    with pytest.raises(ConfigError, match="required") as e:
        load_config(None, schema=schema)
    assert e.value.key == "data.path"
    p = _write(tmp_path, "tracking: optional\ndata:\n  path: x\n")
    assert load_config(p, schema=schema)["tracking"]["mode"] == "optional"
    assert load_config(p, ["tracking=off"], schema)["tracking"]["mode"] == "off"


def test_validate_is_idempotent():
    cfg = load_config(None, ["epochs=3"], SCHEMA)
    assert validate(cfg, SCHEMA) == cfg


def test_cli_helper(tmp_path, capsys):
    p = _write(tmp_path, "epochs: 4\n")
    cfg, args = parse_cli(["--config", str(p), "--skip-bad", "--tracking-optional",
                           "optimizer.lr=0.3"], SCHEMA)
    assert cfg["epochs"] == 4 and cfg["data"]["skip_bad"] is True
    assert cfg["tracking"]["mode"] == "optional" and cfg["optimizer"]["lr"] == 0.3
    with pytest.raises(SystemExit) as e:
        parse_cli(["--config", str(p), "bogus.key=1"], SCHEMA)
    assert e.value.code == 2
    assert "bogus.key" in capsys.readouterr().err


def test_a_retired_key_is_dropped_not_refused():
    """A sweep directory or checkpoint written before ``data.blocks_per_epoch`` went still loads."""
    from pipelines.config import RETIRED_KEYS, validate

    assert "data.blocks_per_epoch" in RETIRED_KEYS
    cfg = validate({"data": {"blocks_per_epoch": 16}}, merged_schema())
    assert "blocks_per_epoch" not in cfg["data"]


@pytest.mark.parametrize("value", ["../../../x", "a/b", "..", ".", "", "a\\b", "x\0y"])
def test_a_name_that_is_used_as_a_folder_must_be_a_plain_name(value):
    """``name`` and ``ray.run_name`` name the run's checkpoint folder under ray.storage_path: a
    path in them (``name=../../../x``) would write outside it, so it is a ConfigError naming the key."""
    from pipelines.config import ConfigError, check_path_name, load_config, merged_schema

    for key in ("name", "ray.run_name"):
        with pytest.raises(ConfigError, match=rf"{key.replace('.', '[.]')}.*not a plain name"):
            check_path_name(value, key)
        if value and "\0" not in value:          # (YAML itself refuses NUL in an override)
            with pytest.raises(ConfigError, match=rf"{key.replace('.', '[.]')}.*not a plain name"):
                load_config(None, [f"{key}={value}"], merged_schema())
    assert load_config(None, ["name=sst-tai2015_v2.1"], merged_schema())["name"] == "sst-tai2015_v2.1"
