"""A capacity study's verdicts as enums (protocol/verdicts.py): read back from capacity.json's flags (old files
without `judged` included), written to it as the same flags, and spelt in its texts and the report's marks as
before."""
import json
from dataclasses import asdict

import pytest

from batchlab.lab.twin_confirm import Confirmation
from batchlab.protocol.verdicts import Agreement, Sustain
from batchlab.stats.capacity import Probe
from batchlab.stats.verdict import Verdict

CASES = [(True, True, Sustain.SUSTAINED, "✓", True), (False, True, Sustain.NOT_SUSTAINED, "✗", False),
         (False, False, Sustain.UNDECIDED, "?", None)]  # sustained, judged → verdict, mark, confirmation's agrees


@pytest.mark.parametrize("sustained, judged, outcome, mark, agrees", CASES)
def test_a_verdict_is_read_back_from_the_flags_capacity_json_holds(sustained, judged, outcome, mark, agrees):
    verdict = Verdict(sustained, [] if sustained else ["why"], 1.0, 0.0, judged=judged)
    written = json.loads(json.dumps(asdict(verdict)))
    assert (written["sustained"], written["judged"]) == (sustained, judged)  # the file's flags, not the enum
    assert verdict.outcome is outcome is Sustain.of(written["sustained"], written["judged"])
    assert verdict.mark == outcome.mark == mark
    confirmation = Confirmation(Probe(5.0, verdict), 20.0, 20.0)
    assert confirmation.agrees is agrees and json.loads(json.dumps(confirmation.as_dict()))["agrees"] is agrees
    assert confirmation.text().startswith(f"{outcome} at λ = 5")


def test_the_values_in_files_and_texts_are_the_words_they_always_were():
    assert [str(s) for s in Sustain] == ["sustained", "not sustained", "undecided"]
    assert [str(a) for a in Agreement] == ["agrees", "disagrees", "undecided"]
    assert [a.said for a in Agreement] == ["agrees", "⚠ disagrees", "undecided"]
    assert [a.mark for a in Agreement] == ["✓", "⚠", "?"]


def test_an_old_probe_without_judged_reads_as_judged():
    assert Sustain.of(True) is Sustain.SUSTAINED and Sustain.of(False) is Sustain.NOT_SUSTAINED


@pytest.mark.parametrize("agrees", [True, False, None])
def test_a_confirmation_flag_round_trips(agrees):
    assert Agreement.of(agrees).flag is agrees
    assert Sustain.of(bool(agrees), agrees is not None).agreement is Agreement.of(agrees)
