"""``kmem console``: a web console over any Kafka broker (kmem's or Kafka's), server-rendered with Flask.

Pages: the topics (partitions, records, bytes on disk where the broker answers DescribeLogDirs), a topic
(its partitions' offsets and its configs), a message browser (a partition from an offset, keys, values and
headers shown as UTF-8, JSON or hex) with a form that produces a message, the consumer groups and a group
(members, committed offsets and lag per partition, computed as ``kafka-consumer-groups`` computes it), the
transactions the brokers' coordinators hold (ListTransactions), and live charts: bytes in and out and requests per
second from the broker's Prometheus endpoint when the console is given its URL (kmem broker's ``metrics.port``, or
Kafka's JMX exporter), else the messages appended per second, from the partitions' offsets. It speaks to the
broker as a Kafka client, with the admin tools' client properties (TLS, SASL), and binds to 127.0.0.1 unless told
otherwise. A page the broker
cannot answer says why (an unknown topic, a malformed offset, a broker gone), never a traceback.
"""
import binascii
import collections
import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request

from kmem.errors import KmemError

log = logging.getLogger(__name__)

FORMATS = ("utf8", "json", "hex")
MAX_MESSAGES = 500          # the most a browser page shows
LATEST, EARLIEST = -1, -2   # ListOffsets' timestamps
TOPIC_RESOURCE, DEFAULT_CONFIG = 2, 5
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")     # shown escaped: a page cannot show them
CHART_POINTS = 150          # the rates a chart keeps: 5 minutes at the page's refresh every 2 s
SAMPLE_SECONDS = 1.0        # the least time between two samples (several pages open share them)
# the counters the live charts follow, by the names the Prometheus JMX exporter gives Kafka's MBeans (kmem
# broker's endpoint uses them): the sample without a topic label is BrokerTopicMetrics' all-topics meter
COUNTERS = {"bytes_in": "kafka_server_brokertopicmetrics_bytesin_total",
            "bytes_out": "kafka_server_brokertopicmetrics_bytesout_total",
            "requests": "kafka_network_requestmetrics_requests_total"}
CHARTS = {"bytes_in": ("Bytes in", "B/s"), "bytes_out": ("Bytes out", "B/s"), "requests": ("Requests", "/s"),
          "messages_in": ("Messages in", "/s")}
_SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)", re.M)

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{ title }} · kmem console</title>
<style>
body { font-family: system-ui, sans-serif; margin: 0; color: #1d2330; }
header { background: #1d2330; color: #fff; padding: .6em 1.2em; }
header a { color: #fff; margin-right: 1.4em; text-decoration: none; }
main { padding: 1em 1.2em; }
table { border-collapse: collapse; margin: .5em 0 1.5em; }
th, td { border-bottom: 1px solid #d8dce5; padding: .3em .8em; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
pre { margin: 0; white-space: pre-wrap; word-break: break-all; max-width: 60em; }
.error { background: #fde8e8; border: 1px solid #e0a0a0; padding: .8em; }
#charts { display: flex; flex-wrap: wrap; gap: 1.5em; }
figure.chart { margin: 0; }
</style></head>
<body><header><strong>kmem console</strong> &nbsp; <a href="/">Topics</a><a href="/groups">Consumer groups</a>
<a href="/transactions">Transactions</a><a href="/live">Live</a>
<span id="broker">{{ bootstrap }}</span></header>
<main><h1>{{ title }}</h1>{% block body %}{% endblock %}</main></body></html>"""

TOPICS = """{% extends "page" %}{% block body %}
<table id="topics"><tr><th>Topic</th><th>Partitions</th><th>Records</th><th>Size on disk</th></tr>
{% for t in topics %}<tr><td><a href="/topics/{{ t.name|urlencode }}">{{ t.name }}</a></td>
<td class="n">{{ t.partitions }}</td><td class="n">{{ t.records }}</td><td class="n">{{ t.size }}</td></tr>
{% else %}<tr><td colspan="4">No topics yet.</td></tr>{% endfor %}</table>{% endblock %}"""

TOPIC = """{% extends "page" %}{% block body %}
<p>Topic id {{ topic_id }}. <a href="/topics/{{ name|urlencode }}/messages">Browse its messages</a></p>
<h2>Partitions</h2>
<table id="partitions"><tr><th>Partition</th><th>Leader</th><th>Earliest offset</th><th>Latest offset</th>
<th>Records</th></tr>
{% for p in partitions %}<tr><td class="n"><a href="/topics/{{ name|urlencode }}/messages?partition={{ p.partition }}">
{{ p.partition }}</a></td><td class="n">{{ p.leader }}</td><td class="n">{{ p.earliest }}</td>
<td class="n">{{ p.latest }}</td><td class="n">{{ p.records }}</td></tr>{% endfor %}</table>
<h2>Configs</h2>
<table id="configs"><tr><th>Name</th><th>Value</th><th>Source</th></tr>
{% for c in configs %}<tr><td>{{ c.name }}</td><td>{{ c.value }}</td><td>{{ c.source }}</td></tr>{% endfor %}
</table>{% endblock %}"""

MESSAGES = """{% extends "page" %}{% block body %}
<form method="get"><label>Partition <select name="partition">{% for p in partitions %}
<option value="{{ p }}"{% if p == partition %} selected{% endif %}>{{ p }}</option>{% endfor %}</select></label>
<label>From offset <input name="offset" value="{{ offset }}" size="10"></label>
<label>Count <input name="limit" value="{{ limit }}" size="5"></label>
<label>Show as <select name="format">{% for f in formats %}<option{% if f == format %} selected{% endif %}>{{ f }}
</option>{% endfor %}</select></label> <button type="submit">Show</button></form>
{% if produced is not none %}<p id="produced">Produced at offset {{ produced }}.</p>{% endif %}
<table id="messages"><tr><th>Offset</th><th>Timestamp</th><th>Key</th><th>Value</th><th>Headers</th></tr>
{% for m in messages %}<tr><td class="n">{{ m.offset }}</td><td>{{ m.timestamp }}</td><td><pre>{{ m.key }}</pre></td>
<td><pre>{{ m.value }}</pre></td><td><pre>{{ m.headers }}</pre></td></tr>
{% else %}<tr><td colspan="5">No messages from offset {{ offset }}.</td></tr>{% endfor %}</table>
<h2>Produce a message to partition {{ partition }}</h2>
<form id="produce" method="post" action="/topics/{{ name|urlencode }}/produce?partition={{ partition }}">
<label>Key <input name="key" size="20"></label> <label>Value <textarea name="value" rows="2" cols="40"></textarea>
</label> <label>Headers (one "name: value" a line) <textarea name="headers" rows="2" cols="30"></textarea></label>
<button type="submit">Produce</button></form>
{% endblock %}"""

TRANSACTIONS = """{% extends "page" %}{% block body %}
<table id="transactions"><tr><th>Transactional id</th><th>Producer id</th><th>State</th></tr>
{% for t in transactions %}<tr><td>{{ t.transactional_id }}</td><td class="n">{{ t.producer_id }}</td>
<td>{{ t.transaction_state }}</td></tr>{% else %}<tr><td colspan="3">No transactional producers.</td></tr>
{% endfor %}</table>{% endblock %}"""

GROUPS = """{% extends "page" %}{% block body %}
<table id="groups"><tr><th>Group</th><th>State</th><th>Type</th></tr>
{% for g in groups %}<tr><td><a href="/groups/{{ g.group_id|urlencode }}">{{ g.group_id }}</a></td>
<td>{{ g.group_state or "Unknown" }}</td><td>{{ g.protocol_type }}</td></tr>
{% else %}<tr><td colspan="3">No consumer groups.</td></tr>{% endfor %}</table>{% endblock %}"""

GROUP = """{% extends "page" %}{% block body %}
<p>State <strong id="state">{{ state }}</strong>, {{ members|length }} member(s), assignor {{ assignor or "-" }}.</p>
<h2>Members</h2>
<table id="members"><tr><th>Member</th><th>Client id</th><th>Host</th><th>Partitions</th></tr>
{% for m in members %}<tr><td>{{ m.member_id }}</td><td>{{ m.client_id }}</td><td>{{ m.client_host }}</td>
<td class="n">{{ m.partitions }}</td></tr>{% else %}<tr><td colspan="4">No active members.</td></tr>{% endfor %}
</table>
<h2>Offsets and lag</h2>
<table id="lag"><tr><th>Topic</th><th>Partition</th><th>Committed offset</th><th>Log end offset</th><th>Lag</th>
<th>Member</th></tr>
{% for r in rows %}<tr><td>{{ r.topic }}</td><td class="n">{{ r.partition }}</td><td class="n">{{ r.committed }}</td>
<td class="n">{{ r.log_end }}</td><td class="n">{{ r.lag }}</td><td>{{ r.member }}</td></tr>{% endfor %}</table>
<p>Total lag <strong id="total-lag">{{ total_lag }}</strong></p>{% endblock %}"""

LIVE = """{% extends "page" %}{% block body %}
<p>{{ source }} Refreshed every 2 seconds while this page is open.</p>
<div id="charts">{{ charts|safe }}</div>
<script>
setInterval(async () => {
  try {
    const answer = await fetch("/live/charts");
    if (answer.ok) document.getElementById("charts").innerHTML = await answer.text();
  } catch (e) {}
}, 2000);
</script>{% endblock %}"""

ERROR = """{% extends "page" %}{% block body %}<p class="error">{{ message }}</p>{% endblock %}"""


class PageError(Exception):
    """A page that cannot be shown: ``status`` and a sentence for the person reading it."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def _shown(data, form):
    """Bytes as the browser shows them: UTF-8 (undecodable bytes and control characters escaped as \\xNN),
    indented JSON (a value that is not JSON said so, with its text), or hex."""
    if data is None:
        return "null"
    if form == "hex":
        return binascii.hexlify(bytes(data), " ").decode()
    text = CONTROL.sub(lambda c: f"\\x{ord(c.group()):02x}", bytes(data).decode("utf-8", "backslashreplace"))
    if form == "json":
        try:
            return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except ValueError:
            return f"(not JSON) {text}"
    return text


def _whole(text, what, lowest):
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise PageError(400, f"{what} must be a whole number, not {text!r}") from None
    if value < lowest:
        raise PageError(400, f"{what} must be at least {lowest}, not {value}")
    return value


def counters_of(text):
    """``{counter: value}`` of ``COUNTERS`` in a Prometheus text page: BrokerTopicMetrics' all-topics sample (the
    per-topic ones summed where there is none), the requests summed over their APIs and versions."""
    per_topic, totals = {}, {}
    names = {name: key for key, name in COUNTERS.items()}
    for name, labels, number in _SAMPLE_LINE.findall(text):
        key = names.get(name)
        if key is None:
            continue
        try:
            value = float(number)
        except ValueError:
            continue
        if key == "requests" or labels in ("", "{}"):
            totals[key] = totals.get(key, 0.0) + value
        else:
            per_topic[key] = per_topic.get(key, 0.0) + value
    return {key: totals.get(key, per_topic.get(key)) for key in COUNTERS if key in totals or key in per_topic}


class Rates:
    """Counters sampled over time (``add``), and the rate of each between consecutive samples (``series``): at
    most ``CHART_POINTS`` of them. A counter that went down (the broker restarted) starts again from there."""

    def __init__(self):
        self._samples = collections.deque(maxlen=CHART_POINTS + 1)      # (seconds, {counter: value})
        self._lock = threading.Lock()

    def add(self, at, counters):
        """Keep a sample taken at ``at`` (seconds), unless the last is less than ``SAMPLE_SECONDS`` old."""
        with self._lock:
            if self._samples and at - self._samples[-1][0] < SAMPLE_SECONDS:
                return
            self._samples.append((at, counters))

    def due(self, at):
        with self._lock:
            return not self._samples or at - self._samples[-1][0] >= SAMPLE_SECONDS

    def series(self, counter):
        """``[(seconds, rate per second)]`` of ``counter``."""
        with self._lock:
            samples = list(self._samples)
        rates = []
        for (before, old), (after, new) in zip(samples, samples[1:]):
            if counter in old and counter in new and new[counter] >= old[counter]:
                rates.append((after, (new[counter] - old[counter]) / (after - before)))
        return rates


def _quantity(value, unit):
    for factor, prefix in ((1 << 30, "Gi"), (1 << 20, "Mi"), (1 << 10, "Ki")):
        if unit == "B/s" and value >= factor:
            return f"{value / factor:.1f} {prefix}{unit}"
    return f"{value:.1f} {unit}"


def chart_svg(key, points, now, width=360, height=140):
    """An SVG line chart of ``points`` ([(seconds, rate)]) up to ``now``, over the time they cover (10 seconds at
    least, the ``CHART_POINTS`` * 2 seconds kept at most), each point marked; ``data-latest`` is the latest rate,
    ``data-points`` how many there are."""
    from html import escape

    title, unit = CHARTS[key]
    span = min(CHART_POINTS * 2.0, max(now - points[0][0] if points else 0.0, 10.0))
    peak = max((rate for _, rate in points), default=0.0)
    xy = [(max(0.0, width - (now - at) / span * width), height - 4 - rate / (peak or 1.0) * (height - 24))
          for at, rate in points]
    latest = points[-1][1] if points else 0.0
    marks = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="#3b6fd4"/>' for x, y in xy)
    return (f'<figure class="chart" id="chart-{key}"><figcaption>{escape(title)}: '
            f'<strong>{escape(_quantity(latest, unit))}</strong></figcaption>'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'data-latest="{latest:.3f}" data-points="{len(points)}" role="img" aria-label="{escape(title)}">'
            f'<rect width="{width}" height="{height}" fill="#f6f7fa"/>'
            f'<line x1="0" y1="20" x2="{width}" y2="20" stroke="#d8dce5" stroke-dasharray="4 3"/>'
            f'<text x="4" y="14" font-size="11" fill="#5a6275">peak {escape(_quantity(peak, unit))}</text>'
            f'<text x="{width - 4}" y="14" font-size="11" fill="#5a6275" text-anchor="end">last {span:.0f} s</text>'
            f'<polyline fill="none" stroke="#3b6fd4" stroke-width="2" '
            f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in xy)}"/>{marks}</svg></figure>')


class Console:
    """What the pages show, asked of the broker through one admin connection (under a lock: Flask serves each
    request on a thread of its own)."""

    def __init__(self, bootstrap_servers, config, metrics_url=None):
        from kmem.admin.client import AdminClient

        self.bootstrap_servers = bootstrap_servers
        self.config = config
        self.metrics_url = metrics_url      # the broker's Prometheus endpoint, for the live charts
        self.rates = Rates()
        self._client = AdminClient(bootstrap_servers, client_id=config["client.id"],
                                   request_timeout_ms=config["request.timeout.ms"],
                                   connect_timeout_ms=config["socket.connection.setup.timeout.ms"],
                                   ssl_context=config["ssl_context"], sasl=config["sasl"])
        self._lock = threading.Lock()

    def close(self):
        self._client.close()

    # -- topics ----------------------------------------------------------------------------------------

    def topics(self):
        with self._lock:
            metadata = self._client.metadata()
            topics = sorted((t for t in metadata.topics if not t.error_code), key=lambda t: t.name)
            offsets = self._offsets([(t.name, p.partition_index) for t in topics for p in t.partitions])
            sizes = self._sizes()
        return [{"name": t.name, "partitions": len(t.partitions),
                 "records": sum(offsets[(t.name, p.partition_index)][1] - offsets[(t.name, p.partition_index)][0]
                                for p in t.partitions if (t.name, p.partition_index) in offsets),
                 "size": sizes.get(t.name, "-")} for t in topics]

    def topic(self, name):
        from kmem.admin.client import topic_id_text
        from kmem.protocol import messages

        with self._lock:
            described = self._topic_metadata(name)
            partitions = sorted(described.partitions, key=lambda p: p.partition_index)
            offsets = self._offsets([(name, p.partition_index) for p in partitions])
            Request = messages.DescribeConfigsRequest
            response = self._client.request(Request(resources=[Request.DescribeConfigsResource(
                resource_type=TOPIC_RESOURCE, resource_name=name, configuration_keys=None)],
                include_synonyms=False, include_documentation=False))
        configs = [{"name": c.name, "value": "(sensitive)" if c.is_sensitive else c.value,
                    "source": "default" if c.config_source == DEFAULT_CONFIG else "set on the topic"}
                   for result in response.results if not result.error_code for c in result.configs]
        rows = []
        for p in partitions:
            earliest, latest = offsets.get((name, p.partition_index), ("-", "-"))
            rows.append({"partition": p.partition_index, "leader": p.leader_id, "earliest": earliest,
                         "latest": latest, "records": "-" if earliest == "-" else latest - earliest})
        return {"topic_id": topic_id_text(described.topic_id), "partitions": rows,
                "configs": sorted(configs, key=lambda c: c["name"])}

    def partitions_of(self, name):
        with self._lock:
            return sorted(p.partition_index for p in self._topic_metadata(name).partitions)

    def _topic_metadata(self, name):
        from kmem.admin.client import check

        topic = self._client.metadata([name]).topics[0]
        if topic.error_code == 3:           # UNKNOWN_TOPIC_OR_PARTITION
            raise PageError(404, f"There is no topic {name!r} on {self.bootstrap_servers}.")
        check(topic.error_code, f"cannot describe topic {name!r}")
        return topic

    def _offsets(self, partitions):
        """``{(topic, partition): (earliest, latest)}`` from each partition's leader."""
        from kmem.admin.groups import _log_end_offsets

        latest = _log_end_offsets(self._client, partitions)
        earliest = _log_end_offsets(self._client, partitions, timestamp=EARLIEST)
        return {tp: (earliest[tp], latest[tp]) for tp in latest if tp in earliest}

    def _sizes(self):
        """``{topic: bytes}`` on every broker's disks (DescribeLogDirs); {} where the broker does not answer it."""
        from kmem.admin.client import AdminError
        from kmem.protocol import messages

        sizes = {}
        for node in sorted(self._client.brokers):
            try:
                response = self._client.request(messages.DescribeLogDirsRequest(topics=None), node)
            except (AdminError, KmemError):
                return {}
            for log_dir in response.results:
                for topic in log_dir.topics:
                    sizes[topic.name] = sizes.get(topic.name, 0) + sum(p.partition_size for p in topic.partitions)
        return sizes

    # -- messages ----------------------------------------------------------------------------------------

    def messages(self, name, partition, offset, limit, form):
        """Up to ``limit`` messages of ``name``-``partition`` from ``offset``, shown as ``form``."""
        from kmem.consumer import Consumer, TopicPartition

        with self._lock:
            if partition not in (p.partition_index for p in self._topic_metadata(name).partitions):
                raise PageError(404, f"Topic {name!r} has no partition {partition}.")
            earliest, end = self._offsets([(name, partition)]).get((name, partition), (0, 0))
        consumer = Consumer.from_properties({
            "bootstrap.servers": self.bootstrap_servers, "enable.auto.commit": False,
            "client.id": self.config["client.id"], **self.config["security_properties"]},
            ssl_context=self.config["ssl_context"])
        shown = []
        try:
            tp = TopicPartition(name, partition)
            consumer.assign([tp])
            consumer.seek(tp, max(offset, earliest))
            # a broker that stops answering ends the page at request.timeout.ms, with what came by then
            deadline = time.monotonic() + self.config["request.timeout.ms"] / 1000
            while len(shown) < limit and consumer.position(tp) < end:
                if time.monotonic() > deadline:
                    if shown:
                        break
                    raise PageError(503, f"The broker at {self.bootstrap_servers} returned no messages of "
                                         f"{name}-{partition} within request.timeout.ms.")
                for record in consumer.poll(500):
                    if len(shown) < limit:
                        shown.append({"offset": record.offset, "timestamp": record.timestamp,
                                      "key": _shown(record.key, form), "value": _shown(record.value, form),
                                      "headers": "\n".join(f"{k}: {_shown(v, form)}" for k, v in record.headers)})
        finally:
            consumer.close()
        return shown

    def produce(self, name, partition, key, value, headers):
        """Produce one message (acks=all) to ``name``-``partition``; its offset."""
        from kmem.admin.client import check
        from kmem.protocol import messages
        from kmem.records import build_records

        Request = messages.ProduceRequest
        records = bytes(build_records([{"key": key, "value": value, "headers": headers,
                                        "timestamp": int(time.time() * 1000)}]))
        with self._lock:
            leaders = {p.partition_index: p.leader_id for p in self._topic_metadata(name).partitions}
            if partition not in leaders:
                raise PageError(404, f"Topic {name!r} has no partition {partition}.")
            response = self._client.request(Request(acks=-1, timeout_ms=30000, transactional_id=None, topic_data=[
                Request.TopicProduceData(name=name, partition_data=[
                    Request.PartitionProduceData(index=partition, records=records)])]), leaders[partition])
        answer = response.responses[0].partition_responses[0]
        check(answer.error_code, f"cannot produce to {name}-{partition}", answer.error_message)
        return answer.base_offset

    # -- transactions ------------------------------------------------------------------------------------

    def transactions(self):
        """Every transactional producer the brokers' transaction coordinators hold (ListTransactions)."""
        from kmem.admin.client import check
        from kmem.protocol import messages

        with self._lock:
            self._client.metadata([])
            states = []
            for node in sorted(self._client.brokers):
                response = self._client.request(messages.ListTransactionsRequest(), node)
                check(response.error_code, f"broker {node} cannot list its transactions")
                states += response.transaction_states
        return sorted(states, key=lambda t: t.transactional_id)

    # -- live charts -------------------------------------------------------------------------------------

    def live_charts(self):
        """The live charts (HTML), a sample taken first when the last is ``SAMPLE_SECONDS`` old."""
        now = time.monotonic()
        if self.rates.due(now):
            self.rates.add(now, self._scraped() if self.metrics_url else self._appended())
        keys = ("bytes_in", "bytes_out", "requests") if self.metrics_url else ("messages_in",)
        return "\n".join(chart_svg(key, self.rates.series(key), now) for key in keys)

    def _scraped(self):
        """The counters of the broker's Prometheus endpoint."""
        timeout = self.config["request.timeout.ms"] / 1000
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=timeout) as answer:
                text = answer.read().decode("utf-8", "replace")
        except (OSError, ValueError) as exc:        # urllib's errors are OSErrors; ValueError: a malformed URL
            raise PageError(503, f"The metrics endpoint {self.metrics_url} does not answer ({exc}).") from None
        counters = counters_of(text)
        if not counters:
            raise PageError(502, f"{self.metrics_url} shows none of {', '.join(COUNTERS.values())}: is it a "
                                 "Kafka broker's Prometheus endpoint?")
        return counters

    def _appended(self):
        """The messages the topics hold, offsets summed (their log end offsets: what was appended)."""
        from kmem.admin.groups import _log_end_offsets

        with self._lock:
            metadata = self._client.metadata()
            offsets = _log_end_offsets(self._client, [(t.name, p.partition_index) for t in metadata.topics
                                                      if not t.error_code and not t.is_internal for p in t.partitions])
        return {"messages_in": float(sum(offsets.values()))}

    # -- groups ------------------------------------------------------------------------------------------

    def groups(self):
        from kmem.admin.groups import _listed_groups

        with self._lock:
            return _listed_groups(self._client)

    def group(self, group_id):
        from kmem.admin.commands import CommandError
        from kmem.admin.groups import MISSING, _assignment, _described, _offset_rows

        with self._lock:
            try:
                _, described = _described(self._client, group_id)
            except CommandError as exc:
                raise PageError(404, str(exc)) from None
            rows = _offset_rows(self._client, group_id, described)
        members = [{"member_id": m.member_id, "client_id": m.client_id, "client_host": m.client_host,
                    "partitions": len(_assignment(described, m))} for m in described.members]
        lag_rows = [{"topic": r[1], "partition": r[2], "committed": r[3], "log_end": r[4], "lag": r[5],
                     "member": r[6]} for r in rows if r[1] != MISSING]
        return {"state": described.group_state, "assignor": described.protocol_data, "members": members,
                "rows": lag_rows, "total_lag": sum(r["lag"] for r in lag_rows if r["lag"] != MISSING)}


def create_app(console):
    """The Flask application of ``console`` (a ``Console``)."""
    import flask
    import jinja2
    from kmem.admin.client import AdminError, MalformedResponseError
    from kmem.consumer.errors import KafkaConnectionError

    app = flask.Flask(__name__)
    app.jinja_loader = jinja2.DictLoader({"page": PAGE, "topics": TOPICS, "topic": TOPIC, "messages": MESSAGES,
                                          "groups": GROUPS, "group": GROUP, "transactions": TRANSACTIONS,
                                          "live": LIVE, "error": ERROR})

    def page(template, title, status=200, **values):
        return flask.render_template(template, title=title, bootstrap=console.bootstrap_servers, **values), status

    @app.errorhandler(PageError)
    def refused(exc):
        return page("error", "Not shown", exc.status, message=str(exc))

    @app.errorhandler(KafkaConnectionError)
    def unreachable(exc):
        return page("error", "Broker unreachable", 503,
                    message=f"The broker at {console.bootstrap_servers} does not answer ({exc}).")

    @app.errorhandler(AdminError)
    @app.errorhandler(MalformedResponseError)
    @app.errorhandler(KmemError)
    def broker_refused(exc):
        return page("error", "Refused by the broker", 502, message=str(exc))

    @app.errorhandler(404)
    def not_found(exc):
        return page("error", "Not found", 404, message=f"There is no page {flask.request.path}.")

    @app.route("/")
    def topics():
        return page("topics", "Topics", topics=console.topics())

    @app.route("/topics/<path:name>/messages")
    def messages(name, produced=None):
        args = flask.request.args
        partitions = console.partitions_of(name)
        partition = _whole(args.get("partition", partitions[0] if partitions else 0), "partition", 0)
        offset = _whole(args.get("offset", 0 if produced is None else produced), "offset", 0)
        limit = min(_whole(args.get("limit", 20), "count", 1), MAX_MESSAGES)
        form = args.get("format", "utf8")
        if form not in FORMATS:
            raise PageError(400, f"format must be one of {', '.join(FORMATS)}, not {form!r}")
        shown = console.messages(name, partition, offset, limit, form)
        return page("messages", f"Messages of {name}", messages=shown, partitions=partitions, partition=partition,
                    offset=offset, limit=limit, format=form, formats=FORMATS, name=name, produced=produced)

    @app.route("/topics/<path:name>/produce", methods=["POST"])
    def produce(name):
        form = flask.request.form
        partition = _whole(flask.request.args.get("partition", 0), "partition", 0)
        headers = []
        for line in form.get("headers", "").splitlines():
            if line.strip():
                header, colon, value = line.partition(":")
                if not colon or not header.strip():
                    raise PageError(400, f"a header is 'name: value', not {line!r}")
                headers.append((header.strip(), value.strip().encode()))
        key = form.get("key", "")
        offset = console.produce(name, partition, key.encode() if key else None, form.get("value", "").encode(),
                                 headers)
        return messages(name, produced=offset)

    @app.route("/transactions")
    def transactions():
        return page("transactions", "Transactions", transactions=console.transactions())

    @app.route("/live")
    def live():
        source = (f"From the broker's metrics endpoint {console.metrics_url}." if console.metrics_url else
                  "From the partitions' offsets (give kmem console --metrics-url for bytes and requests per second).")
        return page("live", "Live", charts=console.live_charts(), source=source)

    @app.route("/live/charts")
    def live_charts():
        return console.live_charts()

    @app.route("/topics/<path:name>")
    def topic(name):
        return page("topic", f"Topic {name}", name=name, **console.topic(name))

    @app.route("/groups")
    def groups():
        return page("groups", "Consumer groups", groups=console.groups())

    @app.route("/groups/<path:group_id>")
    def group(group_id):
        return page("group", f"Consumer group {group_id}", **console.group(group_id))

    return app


def add_command(commands):
    """Register ``kmem console`` on the ``kmem`` command's subparsers."""
    parser = commands.add_parser("console", help="a web console over a Kafka broker: topics, messages, groups, lag",
                                 description=__doc__.split("\n\n")[0].replace("``", "") + " Pages: topics, a "
                                 "topic's partitions and configs, its messages, consumer groups with their lag.")
    parser.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT",
                        help="the broker(s) to connect to: HOST:PORT, or several separated by commas")
    parser.add_argument("--command-config", metavar="FILE",
                        help="client properties, as for kmem topics (security.protocol, sasl.*, ssl.*, client.id)")
    parser.add_argument("--host", default="127.0.0.1", help="the address to serve on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="the port to serve on (default 8080; 0: any free)")
    parser.add_argument("--metrics-url", metavar="URL",
                        help="the broker's Prometheus endpoint (http://127.0.0.1:PORT/metrics with kmem broker's "
                             "metrics.port, or Kafka's JMX exporter): the live charts' bytes and requests per second")
    parser.set_defaults(run=run)


def run(args):
    """Serve the console until SIGINT or SIGTERM; 2 with one line for a bad setting or a missing extra."""
    import importlib.util
    import sys

    from kmem.admin.commands import CommandError, client_config

    if importlib.util.find_spec("flask") is None:
        print("kmem console: error: the console needs Flask: pip install 'kmem[console]'", file=sys.stderr)
        return 2
    try:
        console = Console(args.bootstrap_server, client_config(args.command_config), args.metrics_url)
    except (CommandError, KmemError) as exc:
        print(f"kmem console: error: {exc}", file=sys.stderr)
        return 2
    from werkzeug.serving import make_server

    try:
        server = make_server(args.host, args.port, create_app(console), threaded=True)
    except OSError as exc:
        print(f"kmem console: error: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        console.close()
        return 2
    print(f"kmem console: serving http://{args.host}:{server.server_port}/ for {args.bootstrap_server}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        console.close()
    return 0
