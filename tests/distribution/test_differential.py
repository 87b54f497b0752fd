"""Jobs of several processes train, print and log what one process does: the CI sample of the differential check.

`tests/distribution/differential.py` draws configurations from a seed and
runs each through the command line as one process and as a job on an
engine. Each backend's pass runs its engine's four configurations of the
fixed CI seed (`differential.ci_sample`); `make test-differential` runs a
wide sample of new ones and prints the table. These replace the hand-listed
uneven cases and the two-process worker runs each engine's test file had, and
each engine's killed-worker test (`differential.CI_RESUMED`: one
configuration per engine is killed after its first epoch and run again).
"""

import keras
import pytest

from tests.distribution import differential

ENGINE = keras.backend.backend()


@pytest.mark.one_backend("draws configurations from a seed; nothing runs")
def test_the_ci_sample_reaches_what_broke_jobs_before():
    # The PyTorch job that trained 3e-3 away from one process needed decoding threads and batches split
    # unevenly; the uneven cases before it had a last batch smaller than the process count. Each engine's
    # four configurations must reach those, and the twelve the rest of what changes the arithmetic.
    everything = []
    for engine in differential.ENGINES:
        sample = differential.ci_sample(engine)
        everything += sample
        assert any(config.last_batch() < config.processes for config in sample), engine
        assert any(config.workers > 1 and config.last_batch() % config.processes for config in sample), engine
        assert all(config.comparable(engine) for config in sample), engine
    assert any(config.command == "pretrain" for config in differential.ci_sample("jax"))
    finetuning = [config for config in everything if config.command == "finetune"]
    assert {config.recipe for config in finetuning} == {"paper", "adamw"}
    assert {isinstance(config.held_out, float) for config in finetuning} == {True, False}
    assert {config.augment for config in finetuning} == {True, False}
    assert any(config.accumulation > 1 for config in finetuning) and any(config.lora for config in finetuning)
    assert {config.processes for config in everything} == {2, 3}
    # The engines' killed-worker tests were folded in here: each engine resumes a killed job.
    assert sorted(differential.CI_RESUMED) == sorted(differential.ENGINES)
    for engine in differential.ENGINES:
        assert [config.resume for config in differential.ci_sample(engine)].count(True) == 1, engine
    # Drawn, not listed: the same seed and index give the same configuration.
    assert differential.draw(7, 3) == differential.draw(7, 3) and differential.draw(7, 3) != differential.draw(7, 4)


@pytest.mark.slow  # four configurations, each one process beside a job of 2 or 3 (one killed, then resumed)
@pytest.mark.parametrize("position", range(differential.CI_CASES))
def test_a_job_trains_prints_and_logs_what_one_process_does(tmp_path, position):
    config = differential.ci_sample(ENGINE)[position]
    result = differential.run(config, ENGINE, str(tmp_path))
    print(differential.table_row(result))  # shown by `pytest -rP`
    assert not result.error, result.error[-3000:]
    assert result.weight_difference <= differential.WEIGHT_TOLERANCE, differential.table_row(result)
    assert result.log_difference <= differential.LOG_TOLERANCE, differential.table_row(result)
    assert result.same_line, result.lines
