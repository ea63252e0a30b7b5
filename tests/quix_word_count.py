"""A stateful Quix Streams application for tests/test_broker_quixstreams.py, run in its own interpreter
(quixstreams caps confluent-kafka below the version the test extra holds): counts each word of the topic
``words`` in RocksDB state, which Quix backs with a compacted changelog topic it writes at each commit.

    python tests/quix_word_count.py BOOTSTRAP STATE_DIR COUNT [--guarantee exactly-once] [--output TOPIC]
                                    [--commit-every N] [--delay SECONDS]

Stops after COUNT outputs (0: no limit) or 15 s without one, and prints them as one JSON list of
``[word, count]``. ``--output`` also writes each count to TOPIC (key: the word, value: JSON
``{"word", "count"}``). Under ``--guarantee exactly-once`` Quix commits each checkpoint (every
``--commit-every`` records, 10) as a Kafka transaction of the output, the changelog and the consumer's
offsets, with the fixed ``transactional.id`` ``word-count``, so that a restarted instance fences the one
before it; the consumer is then a static member (``group.instance.id``) so that a restart takes over the
killed instance's partitions at once instead of after its session timeout. ``--delay`` sleeps that long
per record, so that a test can kill the application mid-stream. Needs only quixstreams, not kmem."""
import argparse
import json
import time

import quixstreams


def main(options):
    exactly_once = options.guarantee == "exactly-once"
    app = quixstreams.Application(
        broker_address=options.bootstrap, consumer_group="counter", auto_offset_reset="earliest",
        state_dir=options.state_dir, commit_every=options.commit_every, consumer_poll_timeout=0.1,
        processing_guarantee=options.guarantee,
        producer_extra_config={"transactional.id": "word-count"} if exactly_once else None,
        consumer_extra_config={"group.instance.id": "word-count"} if exactly_once else None)
    words = app.dataframe(app.topic("words", key_deserializer="str", value_deserializer="json"))

    def count(word, state):
        time.sleep(options.delay)
        state.set("count", state.get("count", 0) + 1)
        return {"word": word, "count": state.get("count")}

    words = words.apply(count, stateful=True)
    if options.output:
        words.to_topic(app.topic(options.output, key_serializer="str", value_serializer="json"))
    counts = [(row["word"], row["count"]) for row in app.run(count=options.count, timeout=15)]
    print(json.dumps(counts))


def parse(arguments=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bootstrap")
    parser.add_argument("state_dir")
    parser.add_argument("count", type=int)
    parser.add_argument("--guarantee", choices=["at-least-once", "exactly-once"], default="at-least-once")
    parser.add_argument("--output")
    parser.add_argument("--commit-every", type=int, default=10)
    parser.add_argument("--delay", type=float, default=0)
    return parser.parse_args(arguments)


if __name__ == "__main__":
    main(parse())
