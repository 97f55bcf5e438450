"""User-supplied GPU / model / engine specs that are malformed or extreme: each is an error naming the file,
the line where there is one, the field and what was expected; never a bare traceback or a NaN / inf /
negative step cost."""

import json
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

import hardware.engine as engine_mod
import hardware.gpu as gpu_mod
import hardware.model as model_mod
from hardware import BatchShape, CostModel, Deployment, list_models, load_engine, load_gpu, load_model
from hardware._data import DATA_DIR
from hardware.layers import FfnSpec


def _clear() -> None:
    gpu_mod._load_shipped.cache_clear()
    engine_mod.load_engine.cache_clear()
    model_mod._index.cache_clear()
    model_mod._load_canonical.cache_clear()
    model_mod.list_models.cache_clear()


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of the shipped spec folders that the loaders read instead, so a test can add a user's spec."""
    for sub in ("gpus", "models", "engines"):
        shutil.copytree(DATA_DIR / sub, tmp_path / sub)
    monkeypatch.setattr(gpu_mod, "GPU_DIR", tmp_path / "gpus")
    monkeypatch.setattr(model_mod, "MODEL_DIR", tmp_path / "models")
    monkeypatch.setattr(engine_mod, "ENGINE_DIR", tmp_path / "engines")
    _clear()
    yield tmp_path
    monkeypatch.undo()
    _clear()


H100_TEXT = (DATA_DIR / "gpus" / "h100_sxm.yaml").read_text()
LLAMA = json.loads((DATA_DIR / "models" / "meta-llama--Meta-Llama-3.1-8B.json").read_text())


def _gpu(data: Path, old: str, new: str) -> Path:
    """A user's GPU 'mine': the H100 file with one line's text replaced."""
    assert old in H100_TEXT
    path = data / "gpus" / "mine.yaml"
    path.write_text(H100_TEXT.replace("name: h100_sxm", "name: mine").replace(old, new))
    return path


def _model(data: Path, **fields: Any) -> Path:
    """A user's model 'me/mine': Llama-3.1-8B's config.json with fields changed (None: removed)."""
    cfg = dict(LLAMA)
    for key, value in fields.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    path = data / "models" / "me--mine.json"
    path.write_text(json.dumps(cfg, indent=2))
    return path


def _line(path: Path, key: str) -> int:
    """The line of the file that writes ``key`` (a JSON ``"key":`` or a YAML ``key:``)."""
    return next(i for i, t in enumerate(path.read_text().splitlines(), 1)
                if t.lstrip().startswith((f'"{key}":', f"{key}:")))


# --- GPU specs ------------------------------------------------------------------------------------------

def test_gpu_missing_field_is_named(data: Path) -> None:
    path = _gpu(data, "hbm_bw_Bps: 3.35e12", "")
    with pytest.raises(ValueError) as err:
        load_gpu("mine")
    assert str(err.value) == f"{path}: missing field(s) hbm_bw_Bps"      # was KeyError: 'hbm_bw_Bps'


@pytest.mark.parametrize(("old", "new", "message"), [
    ("hbm_bw_Bps: 3.35e12", "hbm_bw_Bps: [1]", "line 12: hbm_bw_Bps must be a number, got [1]"),
    ("hbm_bw_Bps: 3.35e12", "hbm_bw_Bps: .inf",
     "line 12: GPUSpec.hbm_bw_Bps must be a finite number > 0, got inf"),
    ("hbm_bytes: 85899345920", "hbm_bytes: 80GB", "line 11: hbm_bytes must be an integer, got '80GB'"),
    ("bf16: 989.0e12", "bf16: 0", "line 7: GPU 'mine': peak_flops.bf16 must be a finite number > 0 (FLOP/s), got 0.0"),
    ("bf16: 989.0e12", "bf16: .nan",
     "line 7: GPU 'mine': peak_flops.bf16 must be a finite number > 0 (FLOP/s), got nan"),
    ("scaleup_domain_gpus: 8", "scaleup_domain_gpus: 0",
     "line 14: GPU 'mine': scaleup_domain_gpus must be an integer >= 1, got 0"),
])
def test_gpu_bad_values_name_file_line_and_field(data: Path, old: str, new: str, message: str) -> None:
    # Before: TypeError / AttributeError naming nothing, a ZeroDivisionError (bf16 0), NaN step costs (NaN
    # FLOP/s), or accepted (infinite bandwidth, 0 GPUs per scale-up domain).
    path = _gpu(data, old, new)
    with pytest.raises(ValueError) as err:
        load_gpu("mine")
    assert str(err.value) == f"{path}, {message}"


def test_gpu_unknown_field_and_yaml_syntax_error(data: Path) -> None:
    path = _gpu(data, "num_sms: 132", "num_sm: 132")
    with pytest.raises(ValueError, match=r"^.*mine\.yaml, line 17: unknown field 'num_sm'; valid: name, "):
        load_gpu("mine")
    path.write_text("name: mine\n  peak_flops: [\n")      # was a bare yaml ScannerError
    with pytest.raises(ValueError) as err:
        load_gpu("mine")
    assert str(err.value) == f"{path}, line 2: not valid YAML: mapping values are not allowed in this context"


def test_shipped_gpus_unchanged() -> None:
    gpu = load_gpu("h100_sxm")
    assert (gpu.hbm_bw_Bps, gpu.peak_flops["bf16"], gpu.hbm_bytes) == (3.35e12, 989e12, 85899345920)


# --- engine profiles ------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["-0.001", ".nan", ".inf"])
def test_engine_host_time_must_be_finite_and_non_negative(data: Path, value: str) -> None:
    # Before: a negative per_block_host_s gave negative step costs, NaN / inf gave NaN ones.
    text = (DATA_DIR / "engines" / "vllm.yaml").read_text()
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t.startswith("per_block_host_s:"))
    path = data / "engines" / "mine.yaml"
    path.write_text(text.replace("name: vllm", "name: mine").replace(
        "per_block_host_s:", f"per_block_host_s: {value} #", 1))
    with pytest.raises(ValueError) as err:
        load_engine("mine")
    got = {"-0.001": "-0.001", ".nan": "nan", ".inf": "inf"}[value]
    assert str(err.value) == (f"{path}, line {line}: engine 'mine': per_block_host_s must be a finite number of "
                              f"seconds >= 0, got {got}")


# --- model configs --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("fields", "message"), [
    ({"num_hidden_layers": 0}, "num_hidden_layers must be an integer >= 1, got 0"),   # StopIteration
    ({"num_attention_heads": 0}, "num_attention_heads must be an integer >= 1, got 0"),  # ZeroDivision
    ({"num_attention_heads": "32"}, "num_attention_heads must be an integer >= 1, got '32'"),
    ({"vocab_size": 1.5}, "vocab_size must be an integer >= 1, got 1.5"),                 # truncated
    ({"max_position_embeddings": -1}, "max_position_embeddings must be an integer >= 1, got -1"),
    ({"intermediate_size": 0}, "intermediate_size must be an integer >= 1, got 0"),       # free MLP
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false, got 'false'"),
    ({"hidden_size": 4100, "head_dim": None},
     "hidden_size 4100 is not a multiple of num_attention_heads 32, and no head_dim is given"),
])
def test_model_bad_fields_name_file_line_and_field(data: Path, fields: dict[str, Any], message: str) -> None:
    path = _model(data, **fields)
    with pytest.raises(ValueError) as err:
        load_model("me/mine")
    field = message.split()[0]
    assert str(err.value) == f"{path}, line {_line(path, field)}: {message}"


def test_model_missing_field_and_bad_json(data: Path) -> None:
    path = _model(data, vocab_size=None)
    with pytest.raises(ValueError) as err:       # was KeyError: 'vocab_size'
        load_model("me/mine")
    assert str(err.value) == f"{path}: missing field 'vocab_size' (model_type 'llama' needs it)"
    path.write_text('{\n  "hidden_size": 4096,\n  "x": }\n')      # was a bare JSONDecodeError
    _clear()
    with pytest.raises(ValueError) as err:
        load_model("me/mine")
    assert str(err.value) == f"{path}, line 3: not valid JSON: Expecting value"


def test_model_top_k_above_experts_names_file(data: Path) -> None:
    cfg = json.loads((DATA_DIR / "models" / "Qwen--Qwen3-30B-A3B.json").read_text())
    cfg["num_experts_per_tok"] = 200
    path = data / "models" / "me--mine.json"
    path.write_text(json.dumps(cfg, indent=2))
    with pytest.raises(ValueError) as err:
        load_model("me/mine")
    assert str(err.value) == (f"{path}: model 'me/mine' (model_type 'qwen3_moe'): moe ffn: need 0 < "
                              f"experts_per_token <= num_experts, got 200 of 128")


def test_list_models_skips_a_broken_user_config(data: Path) -> None:
    # Before: list_models() raised the broken file's error, so every unknown-name message failed with it.
    _model(data, num_hidden_layers=0)
    names = list_models()
    assert "me/mine" not in names and "meta-llama/Llama-3.1-8B" in names


def test_ffn_width_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"^dense ffn: intermediate_size must be >= 1, got 0$"):
        FfnSpec(kind="dense", intermediate_size=0)


# --- step costs -----------------------------------------------------------------------------------------

def test_non_finite_step_cost_is_an_error(data: Path) -> None:
    # 1e-300 FLOP/s is a finite positive number, but every compute term overflows to inf: round() raised a
    # bare OverflowError.
    _gpu(data, "bf16: 989.0e12", "bf16: 1.0e-300")
    cm = CostModel(Deployment(gpu=load_gpu("mine"), model=load_model("meta-llama/Llama-3.1-8B"),
                              engine=load_engine("vllm")))
    msg = (r"^step cost is not finite for meta-llama/Llama-3\.1-8B on mine \(qkv_proj=inf, attention=inf, "
           r"o_proj=inf, mlp=inf, lm_head=inf\): check the GPU, model and engine specs for absurd values$")
    with pytest.raises(ValueError, match=msg):
        cm.step_time_ns(BatchShape.from_requests(q=[1], kv=[100]))
    with pytest.raises(ValueError, match=msg):
        cm.decode_step(4, 400)


# --- through the twin -----------------------------------------------------------------------------------

def test_twin_config_with_a_broken_gpu_spec_is_a_config_error(data: Path) -> None:
    from twin.config import load_config
    from twin.core.errors import ConfigError

    _gpu(data, "bf16: 989.0e12", "bf16: 0")       # was a ZeroDivisionError from inside the run
    with pytest.raises(ConfigError) as err:
        load_config({"hardware": {"gpu": "mine"}})
    # The spec's own message: it was "names no known gpu: 'mine'; expected one of [..., 'mine', ...]".
    assert err.value.path == "hardware.gpu" and "peak_flops.bf16 must be a finite number > 0" in err.value.message
    _model(data, num_attention_heads=0)             # was a ZeroDivisionError from load_config
    with pytest.raises(ConfigError) as err:
        load_config({"model": {"name": "me/mine"}})
    assert err.value.path == "model.name" and "num_attention_heads must be an integer >= 1" in err.value.message
    _model(data, model_type="not_a_transformer")
    with pytest.raises(ConfigError) as err:  # an unsupported model type was a bare NotImplementedError
        load_config({"model": {"name": "me/mine"}})
    assert (err.value.path, err.value.message) == (
        "model.name", "name 'me/mine' cannot be loaded: model 'me/mine': "
                      "model_type 'not_a_transformer' is not supported yet")
