"""Every paper recipe (conf/experiment/NAME.yaml, one shared setup per paper shape under experiment/bert-paper/
plus the model, the task and what differs) resolves to its model, task, hyper-parameters and published block.

The table below is the composed config of each recipe as it was when every recipe spelled out its whole body
(before the shared bert-paper/ setups): the refactor changed no recipe. Scores are the papers' (in percent).
"""

from __future__ import annotations

import pytest

from tests.helpers import CONF, compose_config

GLUE = "Devlin et al. 2019, Table 1 (GLUE test server)"
# name: (model, task, lr, epochs, batch_size, eval_every, max_length, main_metric, extra_validation_splits,
#        published.source, published.split, published.scores)
RECIPES = {
    "cola-bert-base": ("bert-base", "cola", 2e-05, 3, 32, 0, 128, "mcc", [],
        GLUE, 'test', {'mcc': 52.1}),
    "cola-bert-large": ("bert-large", "cola", 2e-05, 3, 32, 0, 128, "mcc", [],
        GLUE, 'test', {'mcc': 60.5}),
    "conll2003-bert-base": ("bert-base-cased", "conll2003", 5e-05, 3, 32, 0, 256, "f1", ['test'],
        'Devlin et al. 2019, Table 7', 'dev (f1), test (test/f1)', {'f1': 96.4, 'test/f1': 92.4}),
    "conll2003-bert-large": ("bert-large-cased", "conll2003", 5e-05, 3, 32, 0, 256, "f1", ['test'],
        'Devlin et al. 2019, Table 7', 'dev (f1), test (test/f1)', {'f1': 96.6, 'test/f1': 92.8}),
    "mnli-bert-base": ("bert-base", "mnli", 2e-05, 3, 32, 2000, 128, "accuracy", ['validation_mismatched'],
        GLUE, 'test', {'accuracy': 84.6, 'validation_mismatched/accuracy': 83.4}),
    "mnli-bert-large": ("bert-large", "mnli", 2e-05, 3, 32, 2000, 128, "accuracy", ['validation_mismatched'],
        GLUE, 'test', {'accuracy': 86.7, 'validation_mismatched/accuracy': 85.9}),
    "mrpc-bert-base": ("bert-base", "mrpc", 2e-05, 3, 32, 0, 128, "f1", [],
        GLUE, 'test', {'f1': 88.9}),
    "mrpc-bert-large": ("bert-large", "mrpc", 2e-05, 3, 32, 0, 128, "f1", [],
        GLUE, 'test', {'f1': 89.3}),
    "qnli-bert-base": ("bert-base", "qnli", 2e-05, 3, 32, 0, 128, "accuracy", [],
        GLUE, 'test', {'accuracy': 90.5}),
    "qnli-bert-large": ("bert-large", "qnli", 2e-05, 3, 32, 0, 128, "accuracy", [],
        GLUE, 'test', {'accuracy': 92.7}),
    "qqp-bert-base": ("bert-base", "qqp", 2e-05, 3, 32, 2000, 128, "f1", [],
        GLUE, 'test', {'f1': 71.2}),
    "qqp-bert-large": ("bert-large", "qqp", 2e-05, 3, 32, 2000, 128, "f1", [],
        GLUE, 'test', {'f1': 72.1}),
    "rte-bert-base": ("bert-base", "rte", 2e-05, 3, 32, 0, 128, "accuracy", [],
        GLUE, 'test', {'accuracy': 66.4}),
    "rte-bert-large": ("bert-large", "rte", 2e-05, 3, 32, 0, 128, "accuracy", [],
        GLUE, 'test', {'accuracy': 70.1}),
    "squad-bert-base": ("bert-base", "squad", 5e-05, 3, 32, 2000, 384, "f1", [],
        'Devlin et al. 2019, Table 2 (single model)', 'dev', {'exact_match': 80.8, 'f1': 88.5}),
    "squad-bert-large": ("bert-large", "squad", 5e-05, 3, 32, 2000, 384, "f1", [],
        'Devlin et al. 2019, Table 2 (single model)', 'dev', {'exact_match': 84.1, 'f1': 90.9}),
    "squad_v2-bert-large": ("bert-large", "squad_v2", 5e-05, 2, 48, 2000, 384, "f1", [],
        'Devlin et al. 2019, Table 3 (single model)', 'dev', {'exact_match': 78.7, 'f1': 81.9}),
    "sst2-bert-base": ("bert-base", "sst2", 2e-05, 3, 32, 0, 128, "accuracy", [],
        GLUE, 'test', {'accuracy': 93.5}),
    "sst2-bert-large": ("bert-large", "sst2", 2e-05, 3, 32, 0, 128, "accuracy", [],
        GLUE, 'test', {'accuracy': 94.9}),
    "stsb-bert-base": ("bert-base", "stsb", 2e-05, 3, 32, 0, 128, "spearman", [],
        GLUE, 'test', {'spearman': 85.8}),
    "stsb-bert-large": ("bert-large", "stsb", 2e-05, 3, 32, 0, 128, "spearman", [],
        GLUE, 'test', {'spearman': 86.5}),
    "wnli-bert-base": ("bert-base", "wnli", 2e-05, 3, 32, 0, 128, "accuracy", [],
        "BERT's GLUE leaderboard entry (the majority class; not in the paper)", 'test', {'accuracy': 65.1}),
    "wnli-bert-large": ("bert-large", "wnli", 2e-05, 3, 32, 0, 128, "accuracy", [],
        "BERT's GLUE leaderboard entry (the majority class; not in the paper)", 'test', {'accuracy': 65.1}),
}
SHAPES = {"glue": ("sst2", 2e-5), "squad": ("squad", 5e-5), "conll2003": ("conll2003", 5e-5)}


def test_the_table_names_every_recipe():
    assert sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")) == sorted(RECIPES)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_recipe_resolves_to_its_model_task_hyper_parameters_and_published_block(name):
    model, task, lr, epochs, batch, eval_every, max_length, metric, extra, source, split, scores = RECIPES[name]
    cfg = compose_config("finetune", [f"experiment={name}"])
    assert (cfg.model.name, cfg.task.name, cfg.optim.lr, cfg.trainer.epochs, cfg.trainer.batch_size,
            cfg.trainer.eval_every) == (model, task, lr, epochs, batch, eval_every)
    assert (cfg.task.max_length, cfg.task.main_metric, list(cfg.task.extra_validation_splits)) == (max_length, metric,
                                                                                                    extra)
    assert (cfg.published.source, cfg.published.split, dict(cfg.published.scores)) == (source, split, scores)
    # The rest is the paper's setup, untouched: the scheduler's linear decay after 10% warm-up, fp32 unless asked.
    assert (cfg.scheduler.name, cfg.scheduler.warmup_ratio, cfg.precision.name) == ("linear", 0.1, "fp32")


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_shared_setup_takes_any_model_and_task(shape):
    task, lr = SHAPES[shape]
    cfg = compose_config("finetune", [f"experiment=bert-paper/{shape}", "model=tiny-bert", f"task={task}"])
    assert (cfg.model.name, cfg.task.name, cfg.optim.lr, cfg.trainer.batch_size) == ("tiny-bert", task, lr, 32)
    assert not cfg.published.scores  # the scores belong to a named recipe's model and task
