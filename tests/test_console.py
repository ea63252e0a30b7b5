"""kmem console: its pages over a running broker with topics, messages and a consumer group with lag, and its live
charts from the broker's metrics endpoint, through Flask's test client and in headless Chromium (which also takes
the screenshots in docs/images); bad input and a broker gone get a page that says why."""
import os
import re
import shutil
import threading

import pytest

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from broker_helpers import wait_for
from kmem.admin.commands import client_config
from kmem.broker import Broker

flask = pytest.importorskip("flask")
from kmem.console import Console, Rates, counters_of, create_app      # noqa: E402  (needs Flask)

PARTITIONS, RECORDS, COMMITTED = 3, 30, 4       # COMMITTED records a partition the group has read
# where the browser test leaves its screenshots: docs/images refreshes those of docs/console.md
SCREENSHOTS = os.environ.get("KMEM_CONSOLE_SCREENSHOTS")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with Broker(str(tmp_path_factory.mktemp("broker")), properties={"group.initial.rebalance.delay.ms": 0,
                                                                    "metrics.port": 0}) as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap_servers})
        admin.create_topics([NewTopic("orders", PARTITIONS, 1, config={"retention.ms": "3600000"})])["orders"].result(30)
        producer = Producer({"bootstrap.servers": running.bootstrap_servers})
        for i in range(RECORDS):
            producer.produce("orders", key=b"k%d" % i, value=b'{"n": %d}' % i, partition=i % PARTITIONS,
                             headers=[("trace", b"\xff\x00")])
        producer.produce("orders", value=b"\x00\x01binary", partition=0)
        assert producer.flush(30) == 0
        consumer = KafkaConsumer({"bootstrap.servers": running.bootstrap_servers, "group.id": "billing",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe(["orders"])
        read = {}
        while sum(read.values()) < COMMITTED * PARTITIONS:
            message = consumer.poll(1)
            if message is None or message.error() or read.get(message.partition(), 0) >= COMMITTED:
                continue
            read[message.partition()] = read.get(message.partition(), 0) + 1
            consumer.commit(message, asynchronous=False)
        running.test_member = consumer          # stays in the group: the group page shows it
        yield running
        consumer.close()


def metrics_url(broker):
    return "http://%s:%d/metrics" % broker.metrics_endpoint.address


@pytest.fixture(scope="module")
def console(broker):
    console = Console(broker.bootstrap_servers, client_config(None), metrics_url(broker))
    yield console
    console.close()


@pytest.fixture
def page(console):
    client = create_app(console).test_client()

    def text_of(url, status=200):
        response = client.get(url)
        assert response.status_code == status, response.get_data(as_text=True)
        html = re.sub(r"<style>.*?</style>", "", response.get_data(as_text=True), flags=re.S)
        return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&#39;", "'").replace("&#34;", '"')
    return text_of


def test_the_topics_page_lists_each_topic_with_its_partitions_records_and_size(page, broker):
    text = page("/")
    size = sum(os.path.getsize(os.path.join(broker.log_dir, f"orders-{p}", name))
               for p in range(PARTITIONS) for name in os.listdir(os.path.join(broker.log_dir, f"orders-{p}"))
               if name.endswith(".log"))
    assert f"orders {PARTITIONS} {RECORDS + 1} {size}" in text


def test_a_topic_page_shows_its_partitions_offsets_and_configs(page):
    text = page("/topics/orders")
    assert "0 0 0 11 11" in text and "1 0 0 10 10" in text and "2 0 0 10 10" in text
    assert "retention.ms 3600000 set on the topic" in text and "cleanup.policy delete default" in text


@pytest.mark.parametrize("form, key, value, header", [
    ("utf8", "k0", '{"n": 0}', "trace: \\xff\\x00"),
    ("json", "(not JSON) k0", '{ "n": 0 }', "trace: (not JSON) \\xff\\x00"),
    ("hex", "6b 30", "7b 22 6e 22 3a 20 30 7d", "trace: ff 00")])
def test_the_message_browser_shows_keys_values_and_headers_in_each_format(page, form, key, value, header):
    text = page(f"/topics/orders/messages?partition=0&offset=0&limit=2&format={form}")
    assert f"0 " in text and key in text and value in text and header in text
    assert "k3" in text or "6b 33" in text          # the second message of partition 0
    assert "k6" not in text and "6b 36" not in text  # and no third


def test_a_binary_value_is_shown_escaped_and_said_not_json(page):
    text = page("/topics/orders/messages?partition=0&offset=10&format=json")
    assert "(not JSON) \\x00\\x01binary" in text


def test_the_group_page_shows_members_committed_offsets_and_lag(page):
    text = page("/groups")
    assert "billing Stable consumer" in text
    text = page("/groups/billing")
    lags = [(p, COMMITTED, end, end - COMMITTED) for p, end in ((0, 11), (1, 10), (2, 10))]
    for partition, committed, end, lag in lags:
        assert f"orders {partition} {committed} {end} {lag}" in text
    assert f"Total lag {sum(lag for *_, lag in lags)}" in text and "1 member(s)" in text


@pytest.mark.parametrize("url, status, said", [
    ("/topics/missing", 404, "There is no topic 'missing'"),
    ("/topics/orders/messages?partition=7", 404, "Topic 'orders' has no partition 7"),
    ("/topics/orders/messages?offset=soon", 400, "offset must be a whole number, not 'soon'"),
    ("/topics/orders/messages?offset=-3", 400, "offset must be at least 0, not -3"),
    ("/topics/orders/messages?format=xml", 400, "format must be one of utf8, json, hex, not 'xml'"),
    ("/groups/nobody", 404, "consumer group 'nobody' does not exist"),
    ("/elsewhere", 404, "There is no page /elsewhere")])
def test_bad_input_gets_a_page_that_says_why(page, url, status, said):
    assert said in page(url, status)


def test_a_broker_gone_gets_a_page_that_says_so(tmp_path):
    with Broker(str(tmp_path)) as gone:
        console = Console(gone.bootstrap_servers, client_config(None))
    try:
        response = create_app(console).test_client().get("/")
        assert response.status_code == 503 and "does not answer" in response.get_data(as_text=True)
    finally:
        console.close()


def test_each_page_in_headless_chromium(console, broker, tmp_path):
    """What a person sees in a real browser, and the screenshots of docs/console.md
    (``KMEM_CONSOLE_SCREENSHOTS=docs/images``)."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("no chromium and chromedriver (Debian: apt install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, create_app(console), threaded=True)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,800"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=webdriver.ChromeService(shutil.which("chromedriver")), options=options)
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        def visit(path, shot):
            browser.get(base + path)
            assert browser.save_screenshot(os.path.join(SCREENSHOTS or tmp_path, f"console-{shot}.png"))
            return browser.find_element(By.TAG_NAME, "main").text

        assert "orders" in visit("/", "topics")
        browser.find_element(By.LINK_TEXT, "orders").click()
        assert browser.find_element(By.TAG_NAME, "h1").text == "Topic orders"
        assert "retention.ms" in visit("/topics/orders", "topic")
        text = visit("/topics/orders/messages?partition=0&limit=5&format=json", "messages")
        assert '"n": 0' in text and "(not JSON)" in text
        assert "billing" in visit("/groups", "groups")
        text = visit("/groups/billing", "group")
        assert f"Total lag {RECORDS + 1 - COMMITTED * PARTITIONS}" in text
        assert "Transactional id" in visit("/transactions", "transactions")
        browser.get(base + "/live")
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
        # the page refreshes its charts itself: wait until they show the bytes produced meanwhile


        def charted():          # a few points, the latest with the bytes produced since the one before
            producer.produce("live", b"x" * 1000)
            producer.poll(0)
            # read in one go: the page replaces its charts as it refreshes them
            points, latest = browser.execute_script(
                "const chart = document.querySelector('#chart-bytes_in svg');"
                "return [chart.dataset.points, chart.dataset.latest];")
            return int(points) >= 4 and float(latest) > 0
        wait_for(charted, "the live chart of bytes in")
        assert producer.flush(30) == 0
        assert browser.save_screenshot(os.path.join(SCREENSHOTS or tmp_path, "console-live.png"))
        text = browser.find_element(By.TAG_NAME, "main").text
        assert "Bytes in:" in text and "Bytes out:" in text and "Requests:" in text
        assert "There is no topic 'nope'" in visit("/topics/nope", "error")
    finally:
        browser.quit()
        server.shutdown()


def test_kmem_console_serves_until_stopped_and_refuses_a_bad_setting(broker, tmp_path):
    import signal
    import subprocess
    import sys
    import urllib.request

    served = subprocess.Popen([sys.executable, "-m", "kmem.cli", "console", "--bootstrap-server",
                               broker.bootstrap_servers, "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        line = served.stdout.readline()
        url = re.search(r"serving (http://\S+)", line).group(1)
        with urllib.request.urlopen(url + "groups", timeout=30) as answer:
            assert answer.status == 200 and "billing" in answer.read().decode()
    finally:
        served.send_signal(signal.SIGINT)
        assert served.wait(30) == 0
    bad = tmp_path / "client.properties"
    bad.write_text("security.protocol=CARRIER_PIGEON\n")
    refused = subprocess.run([sys.executable, "-m", "kmem.cli", "console", "--bootstrap-server",
                              broker.bootstrap_servers, "--command-config", str(bad)],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stderr.startswith("kmem console: error:")
    assert "Traceback" not in refused.stderr


def test_a_message_produced_from_the_console_is_shown_at_its_offset(console, broker):
    client = create_app(console).test_client()
    response = client.post("/topics/orders/produce?partition=2", data={
        "key": "typed", "value": '{"from": "console"}', "headers": "source: console\n"})
    text = response.get_data(as_text=True)
    assert response.status_code == 200 and "Produced at offset 10" in text
    assert "typed" in text and "source: console" in text
    refused = client.post("/topics/orders/produce?partition=2", data={"value": "x", "headers": "no colon"})
    assert refused.status_code == 400 and "a header is" in refused.get_data(as_text=True)
    assert broker.logs.get_partition("orders", 2).log_end_offset == 11


def test_the_transactions_page_lists_the_transactional_producers(console, broker):
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "orders-tx"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce("orders", b"in a transaction", partition=1)
    producer.flush(30)
    text = create_app(console).test_client().get("/transactions").get_data(as_text=True)
    assert re.search(r"orders-tx</td><td class=\"n\">\d+</td>\s*<td>Ongoing", text), text
    producer.abort_transaction(30)


def test_a_browse_the_broker_cannot_finish_ends_at_the_request_timeout(broker, monkeypatch):
    """The log end offset promised more than the broker hands out (a broker that stops answering mid-browse):
    the page ends at request.timeout.ms, with the messages that came, or says none came."""
    config = dict(client_config(None), **{"request.timeout.ms": 1000})
    console = Console(broker.bootstrap_servers, config)
    monkeypatch.setattr(console, "_offsets", lambda partitions: {tp: (0, 10_000) for tp in partitions})
    try:
        client = create_app(console).test_client()
        partial = client.get("/topics/orders/messages?partition=0&limit=50")     # partition 0 holds no markers
        shown = partial.get_data(as_text=True).count("<tr><td class=\"n\">")
        assert partial.status_code == 200 and shown == broker.logs.get_partition("orders", 0).log_end_offset
        none = client.get("/topics/orders/messages?partition=0&offset=5000")
        assert none.status_code == 503 and "within request.timeout.ms" in none.get_data(as_text=True)
    finally:
        console.close()


def latest_rates(html):
    """``{chart: its latest rate}`` of the live charts' HTML."""
    return {key: float(rate) for key, rate in
            re.findall(r'id="chart-(\w+)".*?data-latest="([\d.]+)"', html, re.S)}


def test_the_live_charts_show_bytes_and_requests_per_second_from_the_metrics_endpoint(console, broker):
    client = create_app(console).test_client()
    assert "Bytes in" in client.get("/live").get_data(as_text=True)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})

    def charted():
        producer.produce("charted", b"y" * 500)
        producer.flush(30)
        rates = latest_rates(client.get("/live/charts").get_data(as_text=True))
        return rates["bytes_in"] > 0 and rates["requests"] > 0 and rates
    assert set(wait_for(charted, "bytes in and requests charted")) == {"bytes_in", "bytes_out", "requests"}
    # nothing produced between two samples: no bytes in
    wait_for(lambda: latest_rates(client.get("/live/charts").get_data(as_text=True))["bytes_in"] == 0,
             "a sample with no bytes in")


def test_without_a_metrics_endpoint_the_chart_is_messages_appended_per_second(broker):
    console = Console(broker.bootstrap_servers, client_config(None))
    try:
        client = create_app(console).test_client()
        assert "--metrics-url" in client.get("/live").get_data(as_text=True)
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})

        def charted():
            producer.produce("counted", b"z")
            producer.flush(30)
            return latest_rates(client.get("/live/charts").get_data(as_text=True))["messages_in"] > 0
        wait_for(charted, "messages in charted")
        gone = Console(broker.bootstrap_servers, client_config(None), "http://127.0.0.1:1/metrics")
        try:
            refused = create_app(gone).test_client().get("/live")
            assert refused.status_code == 503 and "does not answer" in refused.get_data(as_text=True)
        finally:
            gone.close()
    finally:
        console.close()


def test_rates_come_from_consecutive_samples_and_a_reset_counter_starts_again():
    rates = Rates()
    rates.add(10.0, {"bytes_in": 0.0})
    rates.add(10.5, {"bytes_in": 999.0})        # too soon after the last: not kept
    rates.add(12.0, {"bytes_in": 1000.0})
    rates.add(13.0, {"bytes_in": 40.0})         # the broker restarted
    rates.add(15.0, {"bytes_in": 140.0})
    assert rates.series("bytes_in") == [(12.0, 500.0), (15.0, 50.0)]
    text = ('kafka_server_brokertopicmetrics_bytesin_total{topic="a"} 5.0\n'
            'kafka_server_brokertopicmetrics_bytesin_total 7.0\n'
            'kafka_server_brokertopicmetrics_bytesout_total{topic="a"} 2.0\n'
            'kafka_server_brokertopicmetrics_bytesout_total{topic="b"} 3.0\n'
            'kafka_network_requestmetrics_requests_total{request="Produce",version="9"} 4.0\n'
            'kafka_network_requestmetrics_requests_total{request="Fetch",version="16"} 6.0\n')
    assert counters_of(text) == {"bytes_in": 7.0, "bytes_out": 5.0, "requests": 10.0}
