#!/usr/bin/python3
"""The live job page (src/launcher/page/job.html) in Debian's headless
chromium, against a mock of tiderun's GET /api/job and of two nodes'
GET /api/log, whose GET /api/timeline.svg is drawn by the real renderer
(tide-timeline on the view the mock serves): a two-node job of 4 ranks each with one straggler and one
restart shows every node, rank, state, restart and straggler; a second
restart shows on the next poll; a failing /api/job keeps the last view,
greyed, with the error; a silent node is greyed and one with no health
endpoint says why its logs cannot be read; a clicked rank's log comes from
its own node (cross-origin); text from the JSON is never markup; thousands
of ranks render; and a screenshot, for a look.

    python3 tests/apps/job_page_test.py TIDE_TIMELINE

Screenshots and dumped pages go to $TIDE_TEST_ARTIFACTS (default: a new
temporary folder, printed). Without chromium it skips, with exit status 77.
"""
import copy
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import browser  # noqa: E402

PAGE = os.path.join(HERE, "..", "..", "src", "launcher", "page", "job.html")
BUDGET_MS = 5000  # virtual time: the first poll and two more, 2 s apart
TIDE_TIMELINE = None  # the renderer's program: argv[1]


def artifacts_dir():
    path = os.environ.get("TIDE_TEST_ARTIFACTS")
    if not path:
        path = tempfile.mkdtemp(prefix="tide-job-page-")
        print(f"job page artifacts in {path}", file=sys.stderr)
    os.makedirs(path, exist_ok=True)
    return path


# --- The job, as tiderun's /api/job reports it.

def rank(local, global_rank, pid, step, step_time, rel, ind, straggler=False, state="HEALTHY"):
    return {
        "local_rank": local, "rank": global_rank, "pid": pid, "state": state,
        "beat_age": round(0.2 + 0.15 * local, 2),
        "step": step, "step_time": step_time, "best_step_time": 0.058,
        "relative_score": rel, "individual_score": ind, "straggler": straggler,
    }


def two_node_job(now, health_a, health_b):
    """Two nodes of 4 ranks, 7 minutes in: host-b's rank 5 failed 3.5
    minutes ago (one restart, a new rendezvous round, and host-a's group
    restarted with it); rank 6 on host-b straggles."""
    failed_at = now - 212.5
    restarted_at = now - 209.0
    a_ranks = [rank(i, i, 5101 + i, 1240 - i, 0.061 + 0.001 * i, 1.0 - 0.01 * i, 0.95 - 0.01 * i)
               for i in range(4)]
    b_ranks = [rank(i, 4 + i, 6201 + i, 1238 - i, 0.062 + 0.001 * i, 0.98 - 0.01 * i,
                    0.94 - 0.01 * i) for i in range(4)]
    b_ranks[2].update(step=1191, step_time=0.148, relative_score=0.41, individual_score=0.47,
                      straggler=True)
    membership = "membership change: host-b restarted its workers"
    node = {
        "role": "default", "state": "HEALTHY", "round": 2, "group_world_size": 2,
        "max_restarts": 3, "started_at": now - 420.0, "updated_at": now - 0.4, "age": 0.4,
        "stale": False,
    }
    a = dict(node, node="host-a", slot=0, health=health_a, pid=4242, group_rank=0, restarts=0,
             last_restart=None, ranks=a_ranks, attempts=[
                 {"attempt": 0, "round": 1, "start": now - 418.0, "end": failed_at + 1.2,
                  "outcome": "TERMINATED", "reason": membership},
                 {"attempt": 1, "round": 2, "start": restarted_at, "end": None,
                  "outcome": "RUNNING", "reason": ""},
             ])
    b = dict(node, node="host-b", slot=1, health=health_b, pid=4317, group_rank=1, restarts=1,
             updated_at=now - 0.7, age=0.7,
             last_restart={"at": failed_at,
                           "reason": "worker failure: rank 5 (local 1) exited with code 1"},
             ranks=b_ranks, attempts=[
                 {"attempt": 0, "round": 1, "start": now - 417.0, "end": failed_at,
                  "outcome": "FAILED", "reason": "rank 5 (local 1) exited with code 1"},
                 {"attempt": 1, "round": 2, "start": restarted_at, "end": None,
                  "outcome": "RUNNING", "reason": ""},
             ])
    return {
        "run_id": "llama-7b-ft", "now": now, "state": "HEALTHY", "round": 2, "threshold": 0.7,
        "restarts": 1, "ranks": 8, "nodes": [a, b],
        "stragglers": [{"node": "host-b", "slot": 1, "rank": 6, "local_rank": 2,
                        "relative_score": 0.41, "individual_score": 0.47}],
    }


def restarted_again(job):
    """The same job after rank 6 was killed 8 s ago: host-b's second restart,
    round 3, a third attempt on each node, scores not known yet."""
    job = copy.deepcopy(job)
    now = job["now"]
    killed_at, restarted_at = now - 8.0, now - 5.0
    reason = "rank 6 (local 2) exited with code -9 (SIGKILL)"
    job.update(round=3, restarts=2, stragglers=[])
    for n in job["nodes"]:
        n["round"] = 3
        last = n["attempts"][-1]
        last["end"] = killed_at
        failed = n["node"] == "host-b"
        last["outcome"] = "FAILED" if failed else "TERMINATED"
        last["reason"] = reason if failed else "membership change: host-b restarted its workers"
        n["attempts"].append({"attempt": 2, "round": 3, "start": restarted_at, "end": None,
                              "outcome": "RUNNING", "reason": ""})
        for r in n["ranks"]:
            r.update(pid=r["pid"] + 100, step=12, step_time=0.06, relative_score=None,
                     individual_score=None, straggler=False)
    b = job["nodes"][1]
    b["restarts"] = 2
    b["last_restart"] = {"at": killed_at, "reason": "worker failure: " + reason}
    return job


def log_tail(node, local_rank, global_rank):
    lines = [f"[{node} rank {global_rank}] starting attempt 1, round 2, world size 8"]
    for step in range(1180, 1200):
        lines.append(f"[rank {global_rank}] step {step:5d} | loss {2.0 - step / 2000:.4f} | "
                     f"lr 2.0e-05 | {61 + step % 7}.{step % 10} ms/step")
    return "\n".join(lines) + "\n"


def draw_timeline(view):
    """The SVG tiderun serves at /api/timeline.svg for `view`, drawn by the
    same renderer (src/timeline) through tide-timeline."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "job.json"), os.path.join(tmp, "job.svg")
        with open(src, "w") as f:
            json.dump(view, f)
        subprocess.run([TIDE_TIMELINE, src, "-o", out, "--format", "svg",
                        "--title", f"Timeline of run {view['run_id']}"], check=True, timeout=60)
        with open(out, encoding="utf-8") as f:
            return f.read()


# --- The mock servers: the node whose page is open, and the other node.

USER = """<script>
setTimeout(() => {
  const square = document.querySelector('.rank[data-rank="RANK"]');
  const box = square.getBoundingClientRect();
  const at = {bubbles: true, clientX: box.left + box.width / 2, clientY: box.top + box.height / 2};
  square.dispatchEvent(new MouseEvent("mousemove", at));
  square.dispatchEvent(new MouseEvent("click", at));
}, 1000);
</script>"""

class MockNode:
    """One node's health endpoint on 127.0.0.1: GET / (the page), GET
    /api/job (answers in order, the last one repeated), GET
    /api/timeline.svg (the last /api/job answer, drawn), GET /api/log.
    Records each request's path and query."""

    def __init__(self, serve_job):
        self.lock = threading.Lock()
        self.answers = []  # (status, JSON body)
        self.requests = []
        self.job_requests = 0
        self.logs = {}  # local rank -> text
        node = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def send(self, code, content_type, body, cors=False):
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                if cors:
                    self.send_header("Access-Control-Allow-Origin", "*")
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                with node.lock:
                    node.requests.append((url.path, urllib.parse.parse_qs(url.query)))
                if url.path == "/" and serve_job:
                    with open(PAGE, encoding="utf-8") as f:
                        page = f.read()
                    # /?click=N: a user after the first poll, pointing at
                    # rank N's square and clicking it.
                    click = urllib.parse.parse_qs(url.query).get("click")
                    if click:
                        user = USER.replace("RANK", str(int(click[0])))
                        page = page.replace("</body>", user + "</body>")
                    self.send(200, "text/html; charset=utf-8", page)
                elif url.path == "/api/job" and serve_job:
                    with node.lock:
                        i = min(node.job_requests, len(node.answers) - 1)
                        node.job_requests += 1
                        code, body = node.answers[i]
                    self.send(code, "application/json", json.dumps(body))
                elif url.path == "/api/timeline.svg" and serve_job:
                    with node.lock:
                        i = min(max(node.job_requests - 1, 0), len(node.answers) - 1)
                        code, body = node.answers[i]
                    if code != 200:
                        self.send(code, "text/plain", "no view\n")
                    else:
                        self.send(200, "image/svg+xml", draw_timeline(body))
                elif url.path == "/api/log":
                    local = urllib.parse.parse_qs(url.query).get("rank", [""])[0]
                    with node.lock:
                        text = node.logs.get(local)
                    if text is None:
                        self.send(404, "text/plain", f"no local rank {local}\n", cors=True)
                    else:
                        self.send(200, "text/plain; charset=utf-8", text, cors=True)
                else:
                    self.send(404, "text/plain", "not found\n")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self):
        return f"127.0.0.1:{self.server.server_address[1]}"

    def serve(self, *answers):
        """What /api/job answers from now on: (status, body) pairs, or bodies
        (200), in order; the last repeats."""
        with self.lock:
            self.answers = [a if isinstance(a, tuple) else (200, a) for a in answers]
            self.job_requests = 0

    def paths(self):
        with self.lock:
            return [p for p, _ in self.requests]

    def log_queries(self):
        with self.lock:
            return [q for p, q in self.requests if p == "/api/log"]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@unittest.skipIf(browser.chromium() is None,
                 "chromium is not installed (Debian: apt-get install chromium); "
                 "the job page needs a browser to test")
class JobPageTest(unittest.TestCase):
    maxDiff = None

    @classmethod
    def setUpClass(cls):
        cls.artifacts = artifacts_dir()

    def setUp(self):
        self.a = MockNode(serve_job=True)
        self.b = MockNode(serve_job=False)
        self.addCleanup(self.a.close)
        self.addCleanup(self.b.close)
        self.job = two_node_job(time.time(), self.a.address, self.b.address)
        for local in range(4):
            self.a.logs[str(local)] = log_tail("host-a", local, local)
            self.b.logs[str(local)] = log_tail("host-b", local, 4 + local)

    def url(self, fragment=""):
        return f"http://{self.a.address}/" + fragment

    def dump(self, name, fragment="", size=(1280, 900)):
        dom = browser.dump_dom(self.url(fragment), budget_ms=BUDGET_MS, size=size)
        with open(os.path.join(self.artifacts, f"job_page_{name}.html"), "w") as f:
            f.write(dom)
        return browser.parse_html(dom)

    def card(self, root, node):
        found = root.find_all("article", data_node=node)
        self.assertEqual(len(found), 1, f"one card of {node}")
        return found[0]

    def ranks(self, root):
        return {int(e.get("data-rank")): e for e in root.find_all(class_="rank", data_rank=True)}

    def lane_bars(self, root, node):
        lane = root.find("g", class_="node", data_host=node)
        self.assertIsNotNone(lane, f"a timeline lane of {node}")
        return lane.find_all("rect", data_attempt=True)

    def test_shows_nodes_ranks_straggler_restarts_and_state(self):
        self.a.serve(self.job)
        root = self.dump("two_nodes")

        self.assertEqual(root.by_id("job-state").text, "HEALTHY")
        self.assertEqual(root.by_id("job-state").get("data-state"), "HEALTHY")
        self.assertEqual(root.by_id("run-id").text, "llama-7b-ft")
        self.assertEqual(root.by_id("job-round").text, "2")
        self.assertEqual(root.by_id("job-nodes").text, "2")
        self.assertEqual(root.by_id("job-ranks").text, "8")
        self.assertEqual(root.by_id("job-restarts").text, "1")
        self.assertEqual(root.by_id("job-stragglers").text, "1")
        self.assertIn("live", root.by_id("updated").text)
        self.assertTrue(root.by_id("error").get("hidden") is not None)

        a, b = self.card(root, "host-a"), self.card(root, "host-b")
        self.assertEqual((a.get("data-slot"), b.get("data-slot")), ("0", "1"))
        self.assertEqual(a.find(class_="restarts").text, "0")
        self.assertEqual(b.find(class_="restarts").text, "1")
        self.assertIn("rank 5 (local 1) exited with code 1",
                      b.find(class_="restarts-box").get("data-tip"))
        self.assertEqual({int(e.get("data-rank")) for e in a.find_all(class_="rank")}, {0, 1, 2, 3})
        self.assertEqual({int(e.get("data-rank")) for e in b.find_all(class_="rank")}, {4, 5, 6, 7})

        ranks = self.ranks(root)
        self.assertEqual(sorted(ranks), list(range(8)))
        for r in ranks.values():
            self.assertEqual(r.get("data-state"), "HEALTHY")
        self.assertEqual([g for g, e in ranks.items() if e.get("data-straggler") == "1"], [6])
        tip = ranks[6].get("data-tip")
        for piece in ("rank 6 (local 2) on host-b", "pid 6203", "step 1191", "148 ms/step",
                      "relative 0.41", "individual 0.47", "straggler"):
            self.assertIn(piece, tip)

        rows = root.by_id("stragglers").find("tbody").find_all("tr")
        self.assertEqual([[td.text for td in row.find_all("td")] for row in rows],
                         [["host-b", "6", "2", "0.41", "0.47"]])

        # The timeline: a lane per node, a bar per attempt, the restart marked.
        for node, outcomes in (("host-a", ["TERMINATED", "RUNNING"]),
                               ("host-b", ["FAILED", "RUNNING"])):
            bars = self.lane_bars(root, node)
            self.assertEqual([bar.get("data-outcome") for bar in bars], outcomes)
        markers = root.find("g", class_="node", data_host="host-b").find_all("g", class_="marker")
        self.assertEqual(len(markers), 1)
        self.assertIn("worker failure: rank 5 (local 1) exited with code 1",
                      markers[0].get("data-tip"))

        # Nothing fetched but the page and /api/*.
        self.assertEqual(set(self.a.paths()), {"/", "/api/job", "/api/timeline.svg"})
        self.assertGreaterEqual(self.a.paths().count("/api/job"), 2, "the page polls")

    def test_next_poll_shows_a_restart(self):
        self.a.serve(self.job)
        before = self.dump("before_restart")
        self.assertEqual(self.card(before, "host-b").find(class_="restarts").text, "1")

        self.a.serve(restarted_again(self.job))
        after = self.dump("after_restart")
        self.assertEqual(self.card(after, "host-b").find(class_="restarts").text, "2")
        self.assertEqual(self.card(after, "host-a").find(class_="restarts").text, "0")
        self.assertEqual(after.by_id("job-restarts").text, "2")
        self.assertEqual(after.by_id("job-round").text, "3")
        self.assertEqual(after.by_id("job-stragglers").text, "0")
        self.assertEqual(after.find_all(data_straggler="1"), [])
        bars = self.lane_bars(after, "host-b")
        self.assertEqual([(e.get("data-attempt"), e.get("data-outcome")) for e in bars],
                         [("0", "FAILED"), ("1", "FAILED"), ("2", "RUNNING")])
        markers = after.find("g", class_="node", data_host="host-b").find_all("g", class_="marker")
        self.assertEqual(len(markers), 2)
        self.assertIn("SIGKILL", markers[1].get("data-tip"))

    def test_open_page_redraws_at_each_poll(self):
        # One page: the first poll sees one restart, the later ones two.
        self.a.serve(self.job, restarted_again(self.job))
        root = self.dump("live_update")
        self.assertGreaterEqual(self.a.job_requests, 2)
        self.assertEqual(self.card(root, "host-b").find(class_="restarts").text, "2")
        self.assertEqual(len(self.lane_bars(root, "host-b")), 3)
        self.assertEqual(root.by_id("job-restarts").text, "2")

    def test_failing_api_keeps_last_view_greyed_with_the_error(self):
        store_down = "store unreachable: connection refused (10.0.0.1:29400)"
        self.a.serve(self.job, (503, {"error": store_down}))
        root = self.dump("api_error")
        error = root.by_id("error")
        self.assertIsNone(error.get("hidden"))
        self.assertIn(store_down, error.text)
        self.assertIn("stale-view", root.by_id("view").classes)
        self.assertIn("last update", root.by_id("updated").text)
        self.assertEqual(len(self.ranks(root)), 8, "the last good view stays")
        self.assertGreaterEqual(self.a.job_requests, 3, "the page keeps polling")

    def test_silent_node_greyed_and_missing_health_endpoint_explained(self):
        b = self.job["nodes"][1]
        b.update(stale=True, age=37.2, updated_at=self.job["now"] - 37.2, health="")
        self.a.serve(self.job)
        root = self.dump("silent_node", "#rank=6")
        card = self.card(root, "host-b")
        self.assertIn("stale", card.classes)
        self.assertIn("silent for 37s", card.text)
        self.assertNotIn("stale", self.card(root, "host-a").classes)
        self.assertEqual(root.by_id("job-nodes").text, "2 (1 silent)")
        log = root.by_id("log").text
        self.assertIn("host-b serves no health endpoint", log)
        self.assertEqual(self.b.log_queries(), [])

    def test_node_out_of_the_round_is_shown_apart_and_not_counted(self):
        b = self.job["nodes"][1]
        b.update(stale=True, age=37.2, updated_at=self.job["now"] - 37.2, member=False)
        self.a.serve(self.job)
        root = self.dump("out_of_round", "")
        card = self.card(root, "host-b")
        self.assertIn("out", card.classes)
        self.assertIn("not in the current round", card.text)
        self.assertNotIn("out", self.card(root, "host-a").classes)
        self.assertEqual(root.by_id("job-nodes").text, "1 (+1 not in the round)")

    def test_clicked_rank_log_comes_from_its_node(self):
        self.a.serve(self.job)
        # #rank=N is what a click on rank N's square sets.
        root = self.dump("log", "#rank=6")
        log = root.by_id("log")
        self.assertIn("rank 6 · host-b (local rank 2)", root.by_id("log-title").text)
        self.assertIn("[rank 6] step  1199", log.text)
        self.assertIn(f"from {self.b.address}", log.text)
        self.assertEqual(self.b.log_queries()[0], {"rank": ["2"], "lines": ["200"]})
        self.assertIn("selected", self.ranks(root)[6].classes)
        self.assertNotIn("/api/log", self.a.paths(), "host-a's node serves no other node's log")

    def test_click_on_rank_opens_its_log_and_hover_shows_its_tooltip(self):
        self.a.serve(self.job)
        root = self.dump("click", "?click=6")
        self.assertEqual(self.b.log_queries()[0], {"rank": ["2"], "lines": ["200"]})
        self.assertIn("[rank 6] step  1199", root.by_id("log-text").text)
        self.assertIn("selected", self.ranks(root)[6].classes, "still selected after the redraws")
        # The tooltip outlives the redraws of the polls after the hover.
        tip = root.by_id("tip")
        self.assertIsNone(tip.get("hidden"))
        self.assertIn("rank 6 (local 2) on host-b", tip.text)
        self.assertGreaterEqual(self.a.job_requests, 3)

    def test_text_from_json_is_never_markup(self):
        evil = '<img src=x onerror="document.title=\'owned\'">'
        self.job["run_id"] = evil
        self.job["nodes"][0]["node"] = evil
        self.job["nodes"][1]["last_restart"]["reason"] = "<b>bold</b>"
        self.job["nodes"][1]["attempts"][0]["reason"] = "<script>document.title='owned'</script>"
        self.job["stragglers"][0]["node"] = "<i>x</i>"
        self.a.serve(self.job)
        root = self.dump("escaping")
        self.assertEqual(root.find_all("img"), [])
        self.assertEqual(
            [e for e in root.iter() if e.tag in ("b", "i") and e.text in ("bold", "x")], [])
        self.assertEqual(len(root.find_all("script")), 1, "the page's own script alone")
        self.assertEqual(root.find("title").text, f"tide · {evil} · HEALTHY")
        self.assertEqual(root.by_id("run-id").text, evil)
        self.assertEqual(self.card(root, evil).find(class_="node-name").text, evil)
        self.assertIn("<b>bold</b>", self.card(root, "host-b").find(class_="reason").text)
        self.assertEqual(root.by_id("stragglers").find("tbody").find("td").text, "<i>x</i>")

    def test_thousands_of_ranks(self):
        template = self.job["nodes"][0]
        nodes = []
        for slot in range(512):
            n = copy.deepcopy(template)
            n.update(node=f"node-{slot:03d}", slot=slot, group_rank=slot, group_world_size=512)
            for r in n["ranks"]:
                r["rank"] = slot * 8 + r["local_rank"]
            n["ranks"] += [dict(n["ranks"][i % 4], local_rank=4 + i, rank=slot * 8 + 4 + i)
                           for i in range(4)]
            nodes.append(n)
        nodes[77]["ranks"][3]["straggler"] = True
        # One node whose second attempt failed: it alone stands apart in the
        # timeline, where the 511 alike are one lane.
        odd = nodes[300]["attempts"][1]
        odd.update(end=self.job["now"] - 1, outcome="FAILED", reason="rank 2403 exited with code 1")
        self.job.update(nodes=nodes, ranks=4096, stragglers=[])
        self.a.serve(self.job)
        root = self.dump("4096_ranks")
        ranks = self.ranks(root)
        self.assertEqual(len(ranks), 4096)
        self.assertEqual([g for g, e in ranks.items() if e.get("data-straggler") == "1"],
                         [77 * 8 + 3])
        self.assertEqual(len(root.find_all("article", data_node=True)), 512)
        lanes = root.find_all("g", class_="node", data_host=True)
        self.assertEqual([g.get("data-host") for g in lanes],
                         ["node-000 and 510 more", "node-300"])
        self.assertEqual([(b.get("data-attempt"), b.get("data-outcome"))
                          for b in self.lane_bars(root, "node-300")],
                         [("0", "TERMINATED"), ("1", "FAILED")])
        folded = lanes[0].text
        self.assertIn("511 nodes alike", folded, "its header")
        self.assertIn("4088 workers", folded, "its lane")
        self.assertIn("compact", root.by_id("nodes").classes)

    def test_screenshot(self):
        self.a.serve(self.job)
        path = browser.screenshot(self.url("#rank=6"), os.path.join(self.artifacts, "job_page.png"),
                                  size=(1280, 900), budget_ms=BUDGET_MS)
        self.assertEqual(browser.png_size(path), (1280, 900))
        # A blank or near-blank page compresses to a few kB.
        self.assertGreater(os.path.getsize(path), 40_000)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: job_page_test.py TIDE_TIMELINE")
    TIDE_TIMELINE = sys.argv.pop(1)
    if browser.chromium() is None:
        # 77: skipped, for ctest's SKIP_RETURN_CODE.
        print("skipped: chromium is not installed (Debian: apt-get install chromium)")
        sys.exit(77)
    unittest.main()
