"""Named-entity probes of causal language models (LM_PROBE_SPEC.md; paper: seeds/001).

Public API:

* data       :func:`load_dataset`, :func:`read_bio`, :func:`read_entity_list`, :class:`Sentence`,
             :data:`DATASET_FORMATS` (conll2003, wnut2017, mit_movie, bio, entity_list)
* model      :func:`load_lm` (local directory only), :func:`token_logprobs`, :func:`greedy_generate`
* exposure   :func:`compute_exposure` (word / transition / rank exposure, batched), :func:`classify`,
             :data:`DEFAULT_THRESHOLDS`, :func:`memorized_lists`, :func:`exposure_auc`
* NET        :func:`predict_types`, :func:`f1_table`, :data:`NET_KEYWORDS`
* NER        :func:`run_ner`, :func:`is_correct`, :func:`levenshtein`, :func:`calibrate`
* units      :data:`LM_UNITS` (exposure, net, ner work units), :class:`LMUnit`, :class:`LMUnitResult`
* report     :func:`lm_tables`, :func:`lm_report_section`

The sweep driver that runs the units on the probe pool is ``orchestrator.driver.lm_sweep`` (``iclmem lm``).

The package imports nothing itself: import the submodule that holds a name (above). Reading an LM sweep file
(``orchestrator.schema.lm_config``) needs only the torch-free ones (data, the exposure thresholds, the NER
settings), so a refusal of a tabular or LM sweep file never waits for torch.
"""
