"""A stateful Quix Streams application for tests/test_broker_quixstreams.py, run in its own interpreter
(quixstreams caps confluent-kafka below the version the test extra holds): counts each word of the topic
``words`` in RocksDB state, which Quix backs with a compacted changelog topic it writes at each commit.

    python tests/quix_word_count.py BOOTSTRAP STATE_DIR COUNT

Stops after COUNT outputs (or 15 s without one) and prints them as one JSON list of ``[word, count]``.
Needs only quixstreams, not kmem."""
import json
import sys

import quixstreams


def main(bootstrap, state_dir, outputs):
    app = quixstreams.Application(broker_address=bootstrap, consumer_group="counter", auto_offset_reset="earliest",
                                  state_dir=state_dir, commit_every=10, consumer_poll_timeout=0.1)
    words = app.dataframe(app.topic("words", key_deserializer="str", value_deserializer="json"))

    def count(word, state):
        state.set("count", state.get("count", 0) + 1)
        return {"word": word, "count": state.get("count")}

    words = words.apply(count, stateful=True)
    counts = [(row["word"], row["count"]) for row in app.run(count=outputs, timeout=15)]
    print(json.dumps(counts))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
