"""Engine builds: host terms refitted on one version of an engine (EngineProfile.builds, engine.version)."""

import attrs
import pytest

from hardware import load_engine
from hardware.engine import EngineProfile, engine_from_yaml
from twin.config import load_config
from twin.system import make_deployment


def test_a_build_takes_the_longest_version_it_is_or_starts_with_at_a_dot() -> None:
    base = attrs.evolve(load_engine("sglang"), builds={"0.5": {"eager_moe_host_s": 0.004},
                                                       "0.5.10": {"eager_moe_host_s": 0.002,
                                                                  "eager_layer_host_s": 0.0003}})
    assert base.builds[0][0] == "0.5" and base.builds[1][0] == "0.5.10"
    post1 = base.for_version("0.5.10.post1")
    assert (post1.eager_layer_host_s, post1.eager_moe_host_s) == (0.0003, 0.002)
    assert base.for_version("0.5.10") == post1
    # 0.5.1 and 0.5.100 are not 0.5.10: they fall to the 0.5 entry, the layer term the profile's own
    for other in ("0.5.1", "0.5.100", "0.5.9"):
        e = base.for_version(other)
        assert (e.eager_layer_host_s, e.eager_moe_host_s) == (base.eager_layer_host_s, 0.004)
    assert base.for_version("0.6.0") is base and base.for_version(None) is base and base.for_version("") is base


def test_the_shipped_sglang_profile_lists_its_0_5_10_build() -> None:
    sglang = load_engine("sglang")
    build = sglang.for_version("0.5.10.post1")
    assert (build.eager_layer_host_s, build.eager_moe_host_s) == (0.0003, 0.0015)
    assert (sglang.eager_layer_host_s, sglang.eager_moe_host_s) == (0.0002, 0.003)
    assert sglang.for_version("0.5.9") is sglang and sglang.for_version("nightly-dev") is sglang
    # the rest of the profile is the engine's whatever the build
    assert attrs.evolve(build, eager_layer_host_s=0.0002, eager_moe_host_s=0.003) == sglang


def test_a_build_sets_host_terms_only_and_finite_ones() -> None:
    base = load_engine("vllm")
    with pytest.raises(ValueError, match=r"builds '1\.0' sets 'block_size'; a build sets host terms only"):
        attrs.evolve(base, builds={"1.0": {"block_size": 32}})
    with pytest.raises(ValueError, match=r"builds '1\.0' step_host_s must be a finite number of seconds >= 0"):
        attrs.evolve(base, builds={"1.0": {"step_host_s": -1.0}})
    with pytest.raises(ValueError, match="builds must map a version to its host terms"):
        attrs.evolve(base, builds={"1.0": 0.001})


def test_a_profile_yaml_reads_its_builds(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nversion: '2.0'\nstep_host_s: 0.001\nbuilds:\n  '2.1':\n    step_host_s: 0.0005\n")
    e = engine_from_yaml(path)
    assert isinstance(e, EngineProfile) and e.builds == (("2.1", (("step_host_s", 0.0005),)),)
    assert e.for_version("2.1.3").step_host_s == 0.0005 and e.for_version("2.0").step_host_s == 0.001


def test_engine_version_picks_the_build_for_the_deployment() -> None:
    def dep(version: str | None):  # type: ignore[no-untyped-def]
        cfg = load_config({"engine": {"name": "sglang", **({"version": version} if version else {})},
                           "model": {"name": "Qwen/Qwen3-30B-A3B"}, "hardware": {"gpu": "b300_sxm"}})
        return make_deployment(cfg, 1)

    assert dep("0.5.10.post1").engine.eager_moe_host_s == 0.0015
    assert dep("0.5.9").engine.eager_moe_host_s == 0.003
    assert dep(None).engine.eager_moe_host_s == 0.003
