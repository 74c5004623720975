"""The GRPO application config: loading, dotted overrides, validation errors, and every shipped config."""

from pathlib import Path

import pytest

from agents.train.commands import DEMO_CONFIG
from agents.train.config import GRPOConfig, load_grpo_config
from forge_env.config import ConfigError
from forge_env.models import TINY_MODEL_ID

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.yaml"))


def test_defaults_are_a_valid_app():
    config = load_grpo_config()
    assert isinstance(config, GRPOConfig)
    assert config.env.id == "forge_env/Arithmetic-v0" and config.loop.mode == "sync"


def test_overrides_reach_nested_sections_and_parse_values(tmp_path):
    path = tmp_path / "app.yaml"
    path.write_text("loop: {steps: 5}\ntrainer: {config: {lr: 3.0e-4}}\n")
    config = load_grpo_config(path, ["loop.steps=7", "trainer.config.lr=1e-5", "env.kwargs.digits=3",
                                     "loop.mode=async", "trainer.config.loss_kwargs.clip_high=0.28",
                                     "trainer.config.loss_kwargs.kl_coef=0"])
    assert config.loop.steps == 7
    assert config.trainer.config.lr == pytest.approx(1e-5)
    assert config.env.kwargs == {"digits": 3}
    assert config.loop.mode == "async"
    assert config.trainer.config.loss_kwargs == {"clip_high": 0.28, "kl_coef": 0}


@pytest.mark.parametrize("overrides, message", [
    (["loop.stpes=3"], r"unknown key 'loop.stpes'.*steps"),
    (["rollout.group_size=many"], r"rollout.group_size: expected an integer"),
    (["loop.mode=sometimes"], r"loop.mode: 'sometimes' is not one of"),
    (["rollout.group_size=1"], r"group_size must be >= 2"),
    (["env.id=forge_env/Nope-v0"], r"env.id"),
    (["advantages.method=median"], r"advantages.method: 'median'"),
    (["buffer.batch_size=100"], r"more than one step's rollouts"),
    (["buffer.keep_groups=true", "buffer.batch_size=12"], r"multiple of rollout.group_size"),
    (["trainer.config.temperature=0.7"], r"must equal rollout.sampling.temperature"),
    (["trainer.config.loss_kwargs.kl_coef=0.1", "trainer.reference_model=false"], r"needs trainer.reference_model"),
    (["trainer.config.loss_kwargs={}", "trainer.reference_model=false"], r"kl_coef=0.04, which needs"),
    (["loop.mode=async", "buffer.max_policy_age=null"], r"async needs buffer.max_policy_age"),
    (["trainer.config.loss=sft"], r"warm-up's loss"),
    (["trainer.config.loss=nonsense"], r"trainer.config"),
    (["trainer.backend=titan", "trainer.titan.flavour=0.6B"], r"unknown option\(s\) \['flavour'\]"),
    (["sft.direct_answer_fraction=1.5"], r"direct_answer_fraction"),
    (["generator.backend=vllm", "generator.service=false"], r"vllm runs as a service"),
    (["renderer.parser=openai"], r"renderer.parser: 'openai' is not one of"),
    (["renderer.reasoning=drop"], r"renderer.reasoning"),
])
def test_mistakes_are_reported_with_their_dotted_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_grpo_config(None, overrides)


def test_a_reference_model_is_kept_exactly_when_the_loss_has_a_kl_term():
    assert load_grpo_config(None, ["trainer.config.loss_kwargs={}"]).uses_reference_model()  # grpo's own 0.04
    assert not load_grpo_config(None, ["trainer.config.loss_kwargs.kl_coef=0"]).uses_reference_model()
    assert load_grpo_config(None, ["trainer.config.loss_kwargs.kl_coef=0", "trainer.reference_model=true"]
                            ).uses_reference_model()


def test_a_missing_or_broken_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_grpo_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("loop: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_grpo_config(bad)


def test_the_demo_config_is_the_embedded_cpu_default():
    config = load_grpo_config(DEMO_CONFIG)
    assert config.model.path == "forge-env/tiny-qwen3"
    assert config.sft.enabled and config.env.service.backend == "monarch"
    assert config.trainer.backend == "torch" and config.generator.backend == "hf"


def test_there_are_gpu_recipes():
    names = {p.name for p in EXAMPLES}
    assert {"grpo_gsm8k.yaml", "coding_agent.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_config_builds(path):
    """Load, override-free, and validate each example (this builds the TitanTrainerConfig for titan recipes)."""
    config = load_grpo_config(path)
    if config.trainer.backend == "titan":
        # GPU recipes name their checkpoint; the CPU one (no hf_assets_path) starts from the tiny model.
        assert config.trainer.titan_config().hf_assets_path or config.model.path == TINY_MODEL_ID
    assert Path(config.loop.output_dir).parts[0] == "runs"


def test_generator_config_is_checked_against_the_backend_config_class():
    vllm = ["generator.backend=vllm"]
    with pytest.raises(ConfigError, match="generator.config.max_batch_size"):  # the demo's HF field
        load_grpo_config(DEMO_CONFIG, vllm)
    with pytest.raises(ConfigError, match=r"did you mean \['kv_cache_memory_bytes'\]"):
        load_grpo_config(DEMO_CONFIG, [*vllm, "generator.config={kv_cache_bytes: 1}"])
    with pytest.raises(ConfigError, match="serves model.path"):
        load_grpo_config(DEMO_CONFIG, [*vllm, "generator.config={model: x}"])
    config = load_grpo_config(DEMO_CONFIG, [*vllm, "generator.config={kv_cache_memory_bytes: 33554432}"])
    assert config.generator.config == {"kv_cache_memory_bytes": 33554432}


def test_off_policy_correction_options_load_strictly(tmp_path):
    config = load_grpo_config(None, ["trainer.config.off_policy.tis=sequence", "trainer.config.off_policy.tis_cap=3",
                                     "trainer.config.off_policy.mis=geometric",
                                     "trainer.config.off_policy.mis_low=0.999",
                                     "trainer.config.off_policy.mis_high=1.001"])
    op = config.trainer.config.off_policy
    assert (op.tis, op.tis_cap, op.mis, op.mis_low, op.mis_high) == ("sequence", 3.0, "geometric", 0.999, 1.001)
    assert load_grpo_config().trainer.config.off_policy.enabled is False  # off by default
    # The config a run writes out (plain dicts) loads back to the same options, titan's too.
    import yaml

    from forge_env.config import to_dict
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(to_dict(config)))
    assert load_grpo_config(path).trainer.config.off_policy == op
    titan = load_grpo_config(None, ["trainer.backend=titan", "trainer.config.off_policy.mis=token"])
    assert titan.trainer.titan_config().off_policy.mis == "token"
    for overrides, message in [
        (["trainer.config.off_policy.tis_capp=2"], r"unknown key 'trainer.config.off_policy.tis_capp'.*tis_cap"),
        (["trainer.config.off_policy.mis=tokens"], r"trainer.config.off_policy.mis: 'tokens' is not one of"),
        (["trainer.config.off_policy.tis_cap=0"], r"tis_cap must be > 0"),
        (["trainer.config.off_policy.mis_low=2", "trainer.config.off_policy.mis_high=1.5"], r"mis_low"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_grpo_config(None, overrides)


def test_a_config_naming_torchstore_is_told_it_is_not_supported():
    # The torchstore backend was removed (issue 47): it pinned another Monarch and never ran here.
    with pytest.raises(ConfigError, match=r"generator.weight_transport: torchstore is not supported: .*torchmonarch"):
        load_grpo_config(None, ["generator.weight_transport=torchstore"])
    with pytest.raises(ConfigError, match=r"not 'rign'; did you mean \['ring'\]"):
        load_grpo_config(None, ["generator.weight_transport=rign"])
    assert load_grpo_config(None, ["generator.weight_transport=shm"]).generator.weight_transport == "shm"
