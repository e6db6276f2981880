"""Few-shot classification with ``select``: the labelled examples form a shared prefix.

Each review is classified by scoring the three labels with the model's token
log-probabilities (``select``), not by sampling, so the answer is always one of them and
the meta info carries every label's score.  The few-shot block is the same for every
review, so after the first program it comes from the radix cache.

    radixserve serve &
    python examples/few_shot_select.py  # [--url http://127.0.0.1:30000]
"""
from __future__ import annotations

import argparse

from frontend_lang import RuntimeEndpoint, function, select, set_default_backend

LABELS = ["positive", "negative", "neutral"]

SHOTS = [
    ("The battery lasts two full days and the screen is gorgeous.", "positive"),
    ("It stopped working after a week and support never answered.", "negative"),
    ("The package arrived on Tuesday.", "neutral"),
    ("Best pizza I've had in years, and the staff were lovely.", "positive"),
    ("The film was far too long and the plot made no sense.", "negative"),
    ("The hotel is ten minutes from the station.", "neutral"),
    ("I would happily buy this again, it exceeded my expectations.", "positive"),
    ("The shirt shrank two sizes in the first wash.", "negative"),
]

REVIEWS = [
    ("Absolutely love it, works perfectly out of the box.", "positive"),
    ("Terrible sound quality and the left earbud died.", "negative"),
    ("The manual is written in English and French.", "neutral"),
    ("Friendly service and the coffee was excellent.", "positive"),
    ("Overpriced, slow and the app keeps crashing.", "negative"),
    ("The store opens at nine on weekdays.", "neutral"),
]


@function
def classify(s, review: str):
    s += "Classify the sentiment of each review as positive, negative or neutral.\n\n"
    for text, label in SHOTS:
        s += f"Review: {text}\nSentiment: {label}\n\n"
    s += f"Review: {review}\nSentiment: " + select("label", choices=LABELS)


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    args = ap.parse_args(argv)
    set_default_backend(RuntimeEndpoint(args.url))
    states = classify.run_batch([{"review": r} for r, _ in REVIEWS])
    correct = 0
    for (review, gold), st in zip(REVIEWS, states):
        meta = st.get_meta_info("label")
        scores = ", ".join(f"{c}={x:.2f}" for c, x in zip(LABELS, meta["normalized_prompt_logprobs"]))
        correct += st["label"] == gold
        print(f"{st['label']:8s} (gold {gold:8s}) {scores}  | {review}")
    accuracy = correct / len(REVIEWS)
    print(f"accuracy {accuracy:.2f}")
    return accuracy


if __name__ == "__main__":
    main()
