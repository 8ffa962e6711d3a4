import pytest

from laptrain.hardware.profile import (
    ProfileError,
    load_profile,
    normalize_precision,
    precision_warning,
    profile_names,
    validate_precision,
)

KEYS_OTHER_GROUPS_READ = (
    "batch_size",
    "num_workers",
    "pin_memory",
    "persistent_workers",
    "prefetch_factor",
    "precision",
    "accelerator",
    "devices",
)
SEED_MACHINES = [
    "m1_mini",
    "m2_air",
    "m3_pro",
    "m3_max",
    "m4_pro",
    "m4_max",
    "m5",
    "m5_pro",
    "m5_max",
    "macbook_cpu_8gb",
    "macbook_cpu_16gb",
    "macbook_cpu_32gb",
    "cpu",
    "cuda",
    "mps",
    "auto",
]


def test_every_seed_machine_has_a_profile_with_the_shared_keys_and_a_budget_rule():
    assert set(SEED_MACHINES) <= set(profile_names())
    for name in SEED_MACHINES:
        profile = load_profile(name)
        for key in (*KEYS_OTHER_GROUPS_READ, "memory_fraction", "batch_multiple", "torch_threads"):
            assert key in profile, (name, key)
        assert 0 < profile["memory_fraction"] <= 1
        assert profile["batch_size"] == "auto" or int(profile["batch_size"]) >= 1


def test_auto_profile_composes_to_cpu_values():
    auto, cpu = load_profile("auto"), load_profile("cpu")
    assert auto["name"] == "auto"
    assert {k: v for k, v in auto.items() if k != "name"} == {
        k: v for k, v in cpu.items() if k != "name"
    }


def test_apple_profiles_cap_mps_memory_with_low_at_most_high_and_never_zero():
    for name in SEED_MACHINES:
        profile = load_profile(name)
        if profile["accelerator"] != "mps":
            continue
        env = profile["env"]
        high = float(env["PYTORCH_MPS_HIGH_WATERMARK_RATIO"])
        low = float(env["PYTORCH_MPS_LOW_WATERMARK_RATIO"])
        assert 0 < low <= high <= 1, name
        assert profile["memory_fraction"] <= high, name
        assert profile["pin_memory"] is False, name


def test_workers_and_their_options_agree_in_every_profile():
    for name in profile_names():
        profile = load_profile(name)
        if profile["num_workers"] == 0:
            assert profile["persistent_workers"] is False and profile["prefetch_factor"] is None
        else:
            assert profile["persistent_workers"] is True, name


def test_unknown_profile_names_the_choices():
    with pytest.raises(ProfileError, match="hardware=<one of .*m2_air"):
        load_profile("m9_ultra")


@pytest.mark.parametrize(
    ("precision", "kind", "bf16", "fix"),
    [
        ("16-mixed", "cpu", True, "hardware.precision=bf16-mixed"),
        ("16-mixed", "cpu", False, "hardware.precision=32-true"),
        ("64-true", "mps", True, "hardware.precision=32-true"),
        ("bf16-mixed", "cuda", False, "hardware.precision=16-mixed"),
        ("bf16-true", "mps", False, "hardware.precision=32-true"),
        ("fp8", "cuda", True, "hardware.precision to one of"),
    ],
)
def test_impossible_precisions_are_refused_naming_the_option(precision, kind, bf16, fix):
    with pytest.raises(ProfileError, match=fix) as err:
        validate_precision(precision, kind, bf16)
    assert "\n" not in str(err.value)


def test_possible_precisions_pass_in_lightning_spelling():
    assert validate_precision("16", "cuda", False) == "16-mixed"
    assert validate_precision("bf16-mixed", "mps", True) == "bf16-mixed"
    assert validate_precision("64-true", "cpu", True) == "64-true"
    assert normalize_precision(32) == "32-true"


def test_16_mixed_on_mps_is_allowed_with_one_warning_line():
    """Lightning 2.6.6 builds GradScaler("mps") for 16-mixed on MPS; laptrain lets it through,
    saying it is unmeasured, and says nothing for the tested defaults."""
    assert validate_precision("16-mixed", "mps", True) == "16-mixed"
    line = precision_warning("16-mixed", "mps")
    assert line is not None and "\n" not in line and "32-true" in line
    assert precision_warning("32-true", "mps") is None
    assert precision_warning("16-mixed", "cuda") is None
