"""The receipt's prose, in one place: each (rule, code) rendered from a finding's facts.

Rules return codes and numbers (``Finding.codes``, ``Finding.facts``); ``explain`` turns them
into the check's one sentence: every code's template, in order, joined by "; ". Tests assert
codes and values; docs/verification.md quotes these sentences. A template is a format string
over the facts (``{asr:pct}``: a share as a percentage; ``None`` prints as ``n/a``), or a
function of the facts where the sentence has optional parts.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from fedunlearn.eval.receipt.finding import Finding

__all__ = ["explain", "pct"]

Template = str | Callable[[Mapping[str, Any]], str]


def pct(value: float | None) -> str:
    """A share as a percentage with one decimal (``n/a`` for None)."""
    return "n/a" if value is None else f"{100 * value:.1f}%"


class _Formatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec == "pct":
            return pct(value)
        if value is None:
            return "n/a"
        return super().format_field(value, format_spec)


_FORMAT = _Formatter()
NO_POWER = (
    "this test cannot tell the {unflagged} from a model that never saw {clients} ({detail}), so "
    "it shows nothing either way"
)
_LESS_UNMEASURED = (
    "the model is less trained than every reference model and no clean model this little "
    "trained was measured (Retrain's earlier rounds: needs Retrain), so the flag is not evidence "
    "of the forgotten clients (an under-trained clean model can show it); not cleared"
)


def _when(seconds: float | None) -> str:
    try:
        return datetime.fromtimestamp(float(seconds), UTC).strftime("%Y-%m-%d %H:%M UTC")  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return "an unknown time"


def _pairs(f: Mapping[str, Any]) -> str:
    return ", ".join(f"round {r} client {c}" for r, c in f["pairs"])


def _demoted(show: str) -> Template:
    return (
        "the model is less trained than every reference model, and a clean, less trained model "
        "comes as close ({path}: up to {path_top:" + show + "}), so the flag is not evidence of "
        "the forgotten clients; not cleared"
    )


def _auc_pass(f: Mapping[str, Any]) -> str:
    text = _FORMAT.format("{attack} attack AUC {auc:.3f}, {base_name} {base:.3f}", **f)
    if f.get("original") is not None:
        text += _FORMAT.format(" (the original {original:.3f} is flagged)", **f)
    return text


def _auc_flag(f: Mapping[str, Any]) -> str:
    text = _FORMAT.format(
        "the {attack} attack still tells the forgotten clients' data from unseen data: AUC "
        "{auc:.3f} against {base:.3f} for {base_name}",
        **f,
    )
    if f.get("original") is not None:
        text += _FORMAT.format(" ({original:.3f} before unlearning)", **f)
    return text


def _auc_no_power(f: Mapping[str, Any]) -> str:
    text = _FORMAT.format(
        "{attack} attack AUC {original:.3f} on the original against {base:.3f} for {base_name}", **f
    )
    if f.get("separation") is not None:
        text += _FORMAT.format(", {separation:.1f} standard errors apart", **f)
    return text + _FORMAT.format("; it flags above {fail_line:.3f}", **f)


def _client_line(f: Mapping[str, Any]) -> str:
    kind = f["line_kind"]
    line = f"{f['applied']:.3g}"
    if kind in ("below", "below_path"):
        path = " every clean less trained one measured," if kind == "below_path" else ""
        return f"{line} (every model trained with them,{path} and the calibrated threshold)"
    if kind == "unknown_raised":
        return f"{line} (the highest clean control; no fitness was measured)"
    if kind == "raised":
        return (
            f"{line} (the calibrated threshold {f['threshold']:.3g} plus what training as much as "
            "the model adds to a clean model's score, from the clean controls)"
        )
    return f"{line} (the calibrated threshold)"


def _fitness(f: Mapping[str, Any]) -> str:
    return _FORMAT.format(
        "it is {side} trained than every reference model (mean logit confidence {fitness:.3g} on "
        "the remaining clients' examples; references {low:.3g} to {high:.3g})",
        **f,
    )


def _client(template: str) -> Template:
    def render(f: Mapping[str, Any]) -> str:
        return _FORMAT.format(template, line=_client_line(f), fit=_fitness(f), **f)

    return render


def _client_flags_retrain(f: Mapping[str, Any]) -> str:
    what = "flag" if f["warned"] else "pass"
    return _FORMAT.format(
        "Retrain, which never saw {clients}, scores {retrain:.3g}, above its own flag line: the "
        "test flags a clean model here, so its " + what + " of this model (score {value:.3g}, "
        "line {applied:.3g}) shows nothing either way",
        **f,
    )


def _held_out_null(f: Mapping[str, Any]) -> str:
    anchor = (
        "Retrain as given by the caller, not trained by this receipt"
        if f.get("anchor_given")
        else "the Retrain this receipt trained"
    )
    return (
        "the null is the run's held-out test examples, anchored on " + anchor + ": it detects "
        "a model that treats the clients' training examples unlike test examples of the same "
        "class, and rests on the test set never having been trained or tuned on and on the "
        "anchor being an honest exact Retrain (a model tuned on the test set, or judged against "
        "a dishonest anchor, can pass it); no detection limit is stated"
    )


def _client_off_range_warn(f: Mapping[str, Any]) -> str:
    flag = (
        _FORMAT.format(
            "it would be flagged above every model trained with them and every clean, less "
            "trained one measured, {applied:.3g}",
            **f,
        )
        if f["any_path"]
        else "no clean model this little trained was measured, so no score flags it"
    )
    return _FORMAT.format(
        "{fit}: it scores {value:.3g}, above the calibrated threshold {threshold:.3g} that flags "
        "a model trained as the run was, but a less trained model scores high on these examples "
        "without {clients} ({flag}); not cleared",
        fit=_fitness(f),
        flag=flag,
        **f,
    )


def _markers_shown(f: Mapping[str, Any]) -> str:
    return ", ".join(
        f"client {c} {pct(rate)} (reference {pct(ref)}, original {pct(orig)})"
        for c, rate, ref, orig in f["shown"]
    )


def _markers(template: str) -> Template:
    def render(f: Mapping[str, Any]) -> str:
        return _FORMAT.format(template, shown_text=_markers_shown(f), **f)

    return render


def _distance_source(f: Mapping[str, Any]) -> str:
    if f.get("band_count") is None:
        return _FORMAT.format(
            "the fixed pass line distance_pass ({line:g}x; no band was measured)", **f
        )
    return _FORMAT.format(
        "the spread of {band_count} independent exact retrains (at "
        "{band_low:.2f}-{band_high:.2f}x; {band_level:.0%} prediction bound {line:.2f}x)",
        **f,
    )


def _toward_source(s: Mapping[str, Any]) -> str:
    where = {
        "band": "independent exact retrains (distance band)",
        "client_test": (
            "exact retrains (the client-level test's references trained without the clients)"
        ),
    }
    if s["source"] == "fixed":
        return (
            f"the fixed line distance_toward ({s['cap']:g}; fewer than 3 exact retrains were "
            "measured)"
        )
    capped = f", capped at distance_toward {s['cap']:g}" if s["bound"] > s["cap"] else ""
    return (
        f"{s['count']} {where[s['source']]} lie at {s['low']:.2f} to {s['high']:.2f} (95% "
        f"prediction bound {s['bound']:.2f}{capped})"
    )


def _distance(template: str) -> Template:
    def render(f: Mapping[str, Any]) -> str:
        return _FORMAT.format(
            template,
            source=_distance_source(f),
            toward_text=_toward_source(f["toward_source"]),
            **f,
        )

    return render


def _deleted(f: Mapping[str, Any]) -> str:
    return _FORMAT.format(
        "{payloads} payload(s), {bytes:,} bytes, deleted at {when}; {refused} read(s) of them "
        "refused",
        payloads=f["payloads"],
        bytes=f["bytes"],
        when=_when(f["when"]),
        refused=f["refused"],
    )


def _held(f: Mapping[str, Any]) -> str:
    ids = ", ".join(f["ids"])
    return (
        f"{f['bytes']:,} bytes of updates of client(s) {ids} are still in the store; delete "
        f"them with 'fedunlearn forget RUN --clients {','.join(f['ids'])}'"
    )


RULE_WORDING: dict[str, dict[str, Template]] = {
    "backdoor": {
        "no_backdoor": "the run has no backdoor attack",
        "no_attacker_forgotten": "none of the forgotten clients planted the backdoor",
        "not_measured": "the backdoor ASR could not be measured",
        "others_remain": (
            "{others} other backdoor client(s) stay in the federation, so only a Retrain "
            "reference says what ASR to expect (ASR {asr:pct}, {original:pct} before unlearning; "
            "--reference retrain)"
        ),
        "no_clean_asr": "no clean ASR was measured (no Retrain, no initial model)",
        "survives": (
            "the backdoor survives: ASR {asr:pct} on triggered test inputs against {base:pct} for "
            "{base_name} ({original:pct} before unlearning)"
        ),
        "no_power": (
            "original ASR {original:pct} against {base:pct} for {base_name}; it flags above "
            "{fail_line:pct}"
        ),
        "pass": "ASR {asr:pct} ({base_name}: {base:pct}; {original:pct} before unlearning)",
        "partly": (
            "part of the backdoor survives: ASR {asr:pct} against {base:pct} for {base_name} "
            "({original:pct} before unlearning)"
        ),
        "less_trained_demoted": _demoted("pct"),
        "less_trained_beyond": (
            "the model is less trained than every reference model, and above every clean, less "
            "trained one too ({path}: ASR up to {path_top:pct})"
        ),
        "others_grow_demoted": (
            "other attackers stay in the federation and their backdoor grows with training: a "
            "clean model trained more than Retrain comes as close ({path}: up to {path_top:pct}), "
            "so the flag is not evidence of the forgotten clients; not cleared"
        ),
        "others_grow_unmeasured": (
            "other attackers stay in the federation and their backdoor grows with training, and "
            "no clean model trained more than Retrain was measured (Retrain continued by the "
            "remaining clients), so the flag is not evidence of the forgotten clients; not "
            "cleared"
        ),
        "others_grow_beyond": (
            "beyond every clean model trained more than Retrain while the other attackers stay "
            "too ({path}: ASR up to {path_top:pct})"
        ),
        "honest_not_covered": "it says nothing about the {honest} honest forgotten client(s)",
    },
    "membership": {
        "no_attack": "no membership attack could be run",
        "pass": _auc_pass,
        "partly": _auc_flag,
        "survives": _auc_flag,
        "no_power": _auc_no_power,
        "no_power_unmeasured": "the original was not measured",
    },
    "client_membership": {
        "not_run": "the client-level membership test was not run",
        "not_scored": "the test did not score both the model and the original",
        "not_calibrated": "the test has no calibration, so it shows nothing either way: {why}",
        "invalid": (
            "the model's score ({value:.3g}) or its fitness on the remaining clients' examples is "
            "not a finite number (NaN or infinite outputs): the test cannot place it"
        ),
        "flags_retrain": _client_flags_retrain,
        "off_ground": (
            "the model was not trained from the run's initial model M_0: it lies {ground:.2f}x "
            "the references' training displacement from the nearest one (at most 1 for a model "
            "of this run's start), so the test, calibrated on models trained from M_0, says "
            "nothing either way (a Retrain from another initial model lies there)"
        ),
        "less_trained_unmeasured": _client(
            "{fit}: it scores {value:.3g}, above every model trained with {clients} "
            "({applied:.3g}), but no clean model this little trained was measured (Retrain's "
            "earlier rounds: needs Retrain), and an under-trained clean model can score there "
            "too; not cleared"
        ),
        "found": _client(
            "the test still finds {clients} in the model: score {value:.3g} above {line} "
            "(original {original:.3g})"
        ),
        "found_below": _client(
            "the test still finds {clients} in the model: score {value:.3g} above {line} "
            "(original {original:.3g}); {fit}, yet above every model trained with them "
            "({in_max:.3g}) and every clean, less trained one ({path}: up to {path_top:.3g})"
        ),
        "found_above": _client(
            "the test still finds {clients} in the model: score {value:.3g} above {line} "
            "(original {original:.3g}); {fit}, yet above the clean models"
        ),
        "off_range_warn": _client_off_range_warn,
        "off_range": _client(
            "{fit}: the test is calibrated on models trained as the run was, and its score "
            "({value:.3g}; line {applied:.3g}) says nothing either way about such a model"
        ),
        "no_power": _client(
            "{unflagged} score {unflagged_score:.3g}, at or below the model's flag line {line}"
        ),
        "pass": _client(
            "score {value:.3g} below {line} (original {original:.3g}, above it; power {power})"
        ),
        "held_out_null": _held_out_null,
        "held_out_fallback": (
            "the held-out null does not apply ({fallback}): references trained per request"
        ),
    },
    "markers": {
        "no_marker": (
            "no forgotten client embedded a participation marker (verification.markers in the "
            "run config)"
        ),
        "original_not_measured": "the original's marker rate was not measured",
        "survives": (
            "client {client}'s marker still works: {rate:pct} of marked probe inputs go to its "
            "target against {base:pct} for {base_name} ({original:pct} before unlearning)"
        ),
        "less_trained_beyond": (
            "the model is less trained than every reference model, and beyond every clean, less "
            "trained one too ({path}: up to {path_top:pct})"
        ),
        "no_power": _markers("marker rates {shown_text}; reference: {base_name}"),
        "flags_retrain": _markers("the markers flag Retrain too ({shown_text})"),
        "pass": _markers("marker rates {shown_text}; reference: {base_name}"),
        "partly": _markers("part of a marker still works: {shown_text}; reference: {base_name}"),
        "less_trained_demoted": (
            "the model is less trained than every reference model, and a clean, less trained "
            "model comes as close ({demoted_path}: up to {demoted_top:pct}), so the flag is not "
            "evidence of the forgotten clients; not cleared"
        ),
    },
    "poisoning": {
        "no_poisoning": "no forgotten client ran a non-backdoor poisoning attack",
        "no_retrain": (
            "the original is poisoned ({attack}): only a Retrain reference says what accuracy a "
            "clean model reaches (--reference retrain)"
        ),
        "survives": (
            "the poisoning's damage remains: test accuracy {acc:pct} against {retrain:pct} for "
            "Retrain ({original:pct} before unlearning)"
        ),
        "no_power": "the original's accuracy {original:pct} against Retrain's {retrain:pct}",
        "partly": "test accuracy {acc:pct}, Retrain {retrain:pct}: part of the damage remains",
        "pass": "test accuracy {acc:pct}, Retrain {retrain:pct} (original {original:pct})",
        "less_trained_demoted": (
            "the model is less trained than every reference model, and a clean, less trained "
            "model is as inaccurate ({path}: down to {path_top:pct}), so the drop is not evidence "
            "of the poisoning; not cleared"
        ),
    },
    "distance": {
        "unchanged": "the model is the original model, unchanged",
        "no_retrain": "no Retrain reference was computed (--reference retrain computes one)",
        "not_measured": "the distances could not be measured",
        "no_gap": "the original model equals Retrain: the forgotten clients had no influence",
        "no_gap_away": "this model is {left:.4g} away from both",
        "still_original": (
            "the model is still the original model: it moved {moved_share:.1%} of the "
            "original-to-Retrain gap ({relative:.2f} of the original's distance to Retrain)"
        ),
        "toward": _distance(
            "it keeps {toward:.2f} of the original's offset from Retrain (its position along the "
            "line from Retrain, 0, to the original, 1; its distance to Retrain, {relative:.2f}x "
            "the original's, also counts {across:.2f} across that line), at or beyond "
            "{line_toward:.2f}, where "
            "exact retrains stop: {toward_text}; part of the forgotten clients' influence may "
            "remain where the other checks do not look (the half-way weight average of the "
            "original and Retrain is at 0.50)"
        ),
        "no_power": _distance("it lies at {unflagged_relative:.2f}x, inside {source}"),
        "pass": _distance(
            "{relative:.2f} of the original's distance to Retrain ({toward:.2f} along the "
            "original's offset, {across:.2f} across it), within {source}; distance alone does not "
            "show removal"
        ),
        "beyond": _distance(
            "{relative:.2f}x the original's distance from Retrain ({toward:.2f} along the "
            "original's offset, {across:.2f} across it), beyond {source}: it cannot tell"
        ),
    },
    "bound": {
        "no_bound": "the method certifies no bound",
        "other_model": (
            "{name} is about the distance to {to}, not to the full Retrain; the receipt checks a "
            "bound only on the returned model against Retrain"
        ),
        "no_retrain": "{name}: no Retrain reference to measure it on (--reference retrain)",
        "vacuous": (
            "{name} is vacuous: {bound:.4g} is not below the distance {initial_gap:.4g} from the "
            "initial model M_0 to Retrain"
        ),
        "not_measured": "{name}: the distance to Retrain was not measured",
        "holds": "{name}: distance to Retrain {observed:.4g} <= bound {bound:.4g}",
        "broken": (
            "{name} does not hold: the returned model's distance {observed:.4g} to Retrain exceeds "
            "the certified {bound:.4g}"
        ),
    },
    "utility": {
        "poisoned_original": (
            "the original is poisoned ({attack}): its accuracy is no reference; --reference "
            "retrain gives a clean one"
        ),
        "not_measured": "test accuracy could not be measured",
        "pass": "test accuracy {acc:pct}, {base_name} {base:pct}",
        "drop": (
            "test accuracy {acc:pct} is {drop_points:.1f} points below {base_name} ({base:pct})"
        ),
        "dp_noise_free": (
            "Retrain trains without the run's DP noise, so part of a DP method's drop is the cost "
            "of privacy"
        ),
        "dp_reference": "Retrain ran under the run's DP mechanism (a DP Retrain)",
    },
    "deletion": {
        "not_read": "the run's history store was not read",
        "readable": lambda f: f"{f['count']} deleted payload(s) can still be read ({_pairs(f)})",
        "rebuildable": lambda f: (
            f"{f['count']} deleted update(s) can be rebuilt from what the store keeps "
            f"({_pairs(f)}): the deletion is not a deletion"
        ),
        "unrecorded": lambda f: (
            f"{f['count']} update(s) the store's catalogue says were kept are gone with no "
            f"deletion record ({_pairs(f)}): deleted outside 'fedunlearn forget' (raw SQL?), so "
            "the deletion cannot be vouched for"
        ),
        "rows_missing": lambda f: (
            f"the run's seeded sampler drew the client(s) in {f['count']} round(s) whose rows "
            f"are gone with no deletion record ({_pairs(f)}): their updates and rows were "
            "deleted outside 'fedunlearn forget' (raw SQL?), so the deletion cannot be vouched for"
        ),
        "models_unrecorded": lambda f: (
            f"{f['count']} model(s) the catalogue says were kept are gone with no deletion "
            "record (" + ", ".join(f"round {r} {k}" for r, k in f["models"]) + ")"
        ),
        "scalars_kept": lambda f: (
            f"{f['count']} round record(s) still hold the norm or inner product of a deleted "
            f"update ({_pairs(f)}), which with the kept models rebuilds it; run 'fedunlearn "
            "forget' for these clients again"
        ),
        "result_files": lambda f: (
            f"{f['count']} result file(s) in the run directory hold their updates ("
            + ", ".join(f"{x['path']}, {x['size_bytes']:,} bytes" for x in f["files"])
            + "); 'fedunlearn forget' deletes them"
        ),
        "fragments": (
            "the page scan found {count:,} fragment(s) of deleted payloads in the store's files"
        ),
        "scan_failed": "deleted data is still in the store's files: {why}",
        "kept_on_recover": lambda f: (
            f"a recovery request does not ask to delete the attackers' updates ({f['bytes']:,} "
            f"bytes of clients {', '.join(f['ids'])} are kept)"
        ),
        "held": _held,
        "deleted": _deleted,
        "never_held": "the store never held updates of the forgotten clients",
        "scan_not_run": "but the page scan of the store's files did not run ({why})",
    },
    "method_warnings": {
        "unavailable": (
            "none were available (audit --result R.json carries the method's warnings)"
        ),
        "none": "none",
        "warned": lambda f: "; ".join(f["warnings"]),
    },
}

GENERIC: dict[str, Template] = {
    "no_control": (
        "every forgotten client was removed by an applied result, so the run's current model, "
        "this check's negative control, no longer carries their influence: no check has power "
        "here (each client's entry names the applied event and the receipt that judged it)"
    ),
    "less_trained_unmeasured": _LESS_UNMEASURED,
    "flags_retrain": "the test flags Retrain too",
}


def _render(template: Template, facts: Mapping[str, Any]) -> str:
    if callable(template):
        return template(facts)
    return _FORMAT.vformat(template, (), facts)


def explain(rule: str, finding: Finding, clients: str) -> str:
    """Return the sentence of ``finding`` (codes of rule ``rule``), quoting its facts."""
    facts = {"clients": clients, **finding.facts}
    table = RULE_WORDING.get(rule, {})
    parts = []
    for code in finding.codes:
        template = table.get(code, GENERIC.get(code))
        if template is None:
            parts.append(code.replace("_", " "))
            continue
        text = _render(template, facts)
        if code.startswith("no_power"):
            text = NO_POWER.format(
                unflagged=facts.get("unflagged") or "original", clients=clients, detail=text
            )
        parts.append(text)
    return "; ".join(parts)
