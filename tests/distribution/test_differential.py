"""Jobs of several processes train, print and log what one process does: the CI sample of the differential check.

`tests/distribution/differential.py` draws configurations from a seed and
runs each through the command line as one process and as a job on an
engine. Each backend's pass runs its engine's `CI_CASES` configurations of the
fixed CI seed (`differential.ci_sample`, the seed drawn by
`differential.search_ci_seed`); `make test-differential` runs a
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
    # What the sample must reach is stated once (`differential.ci_misses`), for this test and the seed search.
    samples = {engine: differential.ci_sample(engine) for engine in differential.ENGINES}
    assert differential.ci_misses(samples) == []
    # The engines' killed-worker tests were folded in here: each engine resumes a killed job, at the position
    # the search's rule picks (not by hand).
    assert sorted(differential.CI_RESUMED) == sorted(differential.ENGINES)
    for engine in differential.ENGINES:
        plain = differential.ci_sample(engine, resumed=None)
        assert differential.CI_RESUMED[engine] == differential.resumed_position(plain), engine
    # Drawn, not listed: the same seed and index give the same configuration.
    assert differential.draw(7, 3) == differential.draw(7, 3) and differential.draw(7, 3) != differential.draw(7, 4)


@pytest.mark.one_backend("draws configurations from a seed; nothing runs")
def test_ci_misses_names_what_a_sample_leaves_out():
    # The property must be able to fail: a sample without its resumed fine-tunes, pre-training or LoRA.
    samples = {engine: differential.ci_sample(engine, resumed=None) for engine in differential.ENGINES}
    misses = differential.ci_misses(samples)
    assert all(f"{engine}: not exactly one killed and resumed fine-tune" in misses
               for engine in differential.ENGINES), misses
    only_finetunes = {engine: [c for c in sample if c.command == "finetune" and not c.lora]
                      for engine, sample in samples.items()}
    misses = differential.ci_misses(only_finetunes)
    assert "jax: no pretrain" in misses and "none with LoRA" in misses, misses


@pytest.mark.slow  # each configuration: a job of 2 or 3 (one per engine killed, then resumed) beside one run here
@pytest.mark.parametrize("position", range(differential.CI_CASES))
def test_a_job_trains_prints_and_logs_what_one_process_does(tmp_path, position):
    # The one-process run is the command line in this process (its printed lines captured): this pass has
    # started Keras on the engine's backend already, so only the job's processes start Python.
    config = differential.ci_sample(ENGINE)[position]
    result = differential.run(config, ENGINE, str(tmp_path), in_process=True)
    print(differential.table_row(result))  # shown by `pytest -rP`
    assert not result.error, result.error[-3000:]
    assert result.weight_difference <= differential.WEIGHT_TOLERANCE, differential.table_row(result)
    assert result.log_difference <= differential.LOG_TOLERANCE, differential.table_row(result)
    assert result.same_line, result.lines
