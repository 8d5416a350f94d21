"""Which settings a run reads, one rule for the setup form, `dpw show`, the run panel, Compare and the
report (engine.settings_in_effect); the rules for images, given test data and table scaling are tested
beside them (test_feature_scaling, test_given_test_data)."""

from __future__ import annotations

from engine.config import RunConfig
from engine.settings_in_effect import settings_in_effect, settings_without_effect
from workbench.runs_panel import settings_in_use


def test_the_attack_fpr_is_read_only_with_a_target_attack_tpr():
    assert "target_attack_fpr" not in settings_in_effect(RunConfig(dataset="digits", target_epsilon=2.0).to_dict())
    with_tpr = RunConfig(dataset="digits", target_attack_tpr=0.05, target_attack_fpr=0.001).to_dict()
    assert {"target_attack_tpr", "target_attack_fpr"} <= set(settings_in_effect(with_tpr))
    assert "target_attack_fpr" not in settings_in_effect({"dataset": "digits", "target_attack_tpr": ""})  # form text
    assert settings_without_effect({"dataset": "digits", "noise_multiplier": 1.0, "target_attack_fpr": 0.05}) \
        == ["target_attack_fpr"]


def test_the_canary_kind_is_read_only_with_canaries():
    for none in (0, "0", "", None):
        assert "audit_canary_kind" not in settings_in_effect({"dataset": "digits", "audit_canaries": none})
    assert "audit_canary_kind" in settings_in_effect({"dataset": "digits", "audit_canaries": "200"})
    assert settings_without_effect({"dataset": "digits", "audit_canary_kind": "gradient"}) == ["audit_canary_kind"]


def test_the_run_panel_lists_the_settings_dpw_show_lists():
    config = RunConfig(name="q", dataset="digits", target_epsilon=2.0, optimizer="adam").to_dict()
    listed = settings_in_use({**config, "a_key_from_a_newer_version": 1})
    assert set(listed) == set(settings_in_effect(config)) | {"a_key_from_a_newer_version"}
    assert not {"target_attack_fpr", "audit_canary_kind", "momentum", "classes", "normalization"} & set(listed)
