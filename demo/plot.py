"""Draw the rollout timeline from out/demo/rollout.json (runs on the host after the VM):

    python -m demo.plot [--in out/demo/rollout.json] [--out out/demo/timeline.png]

One panel per mode. Per pod: the endpoint as the API published it (ready / terminating),
the real server as the kernel showed it (weight 1 / weight 0, with its connection count), the
app's SIGTERM and exit, and ipvsctl's deletion with its reason. Below: every short request
(grey: answered, red: failed) and long-lived connection breaks.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def segments(
    samples: list[list[Any]], ip: str, gap: float = 1.0
) -> list[tuple[float, float, int, int]]:
    """Runs of equal weight from the kernel samples of one real server:
    (start, end, weight, max connections in the run)."""
    out: list[tuple[float, float, int, int]] = []
    cur: list[Any] | None = None
    for t, addr, weight, active, inactive in samples:
        if addr != ip:
            continue
        if cur and cur[2] == weight and t - cur[1] <= gap:
            cur[1] = t
            cur[3] = max(cur[3], active + inactive)
        else:
            if cur:
                out.append(tuple(cur))  # type: ignore[arg-type]
            cur = [t, t, weight, active + inactive]
    if cur:
        out.append(tuple(cur))  # type: ignore[arg-type]
    return out


def draw(doc: dict[str, Any], summary: dict[str, Any], ax: Any) -> None:
    pods = list(doc["pods"].values())
    end = doc["phases"]["end"]
    log = doc["ipvsctl_log"]
    ylabels = []
    for i, pod in enumerate(pods):
        y = len(pods) - i
        ylabels.append((y, f"{pod['name']}\n{pod['ip']}"))
        # the endpoint, as the API published it
        ready_end = pod["terminating"] or end
        if pod["ready"] is not None:
            ax.broken_barh(
                [(pod["ready"], ready_end - pod["ready"])],
                (y + 0.05, 0.3),
                color="#7fbf7f",
                label="endpoint ready (API)",
            )
        if pod["terminating"] is not None:
            stop = pod["endpoint_removed"] or end
            ax.broken_barh(
                [(pod["terminating"], stop - pod["terminating"])],
                (y + 0.05, 0.3),
                color="#f2c46d",
                label="endpoint terminating (API)",
            )
        # the real server, as the kernel showed it
        for t0, t1, weight, conns in segments(doc["kernel"], pod["ip"]):
            color = "#3b6fb6" if weight > 0 else "#e07b39"
            label = "IPVS weight 1 (kernel)" if weight > 0 else "IPVS weight 0, draining (kernel)"
            ax.broken_barh([(t0, max(t1 - t0, 0.2))], (y - 0.35, 0.3), color=color, label=label)
            if weight == 0 and t1 - t0 > 3:
                ax.text(
                    t0 + 0.3,
                    y - 0.2,
                    f"conns≤{conns}",
                    fontsize=6,
                    va="center",
                    color="white" if t1 - t0 > 4 else "black",
                )
        # the app
        if pod["sigterm"] is not None:
            ax.plot(
                [pod["sigterm"]] * 2,
                [y - 0.4, y + 0.4],
                color="black",
                lw=1,
                label="SIGTERM (after preStop)",
            )
        if pod["exited"] is not None:
            ax.plot(
                pod["exited"], y + 0.2, marker="x", color="black", ms=6, label="app exited / killed"
            )
        if pod["deadline"] is not None:
            ax.plot(
                [pod["deadline"]] * 2,
                [y - 0.45, y + 0.45],
                color="grey",
                lw=1,
                ls=":",
                label="deletionTimestamp (grace over)",
            )
        rs = f"{pod['ip']}:8080"
        for r in log:
            if r["msg"] == "real server deleted" and r.get("rs") == rs:
                ax.plot(
                    r["t"],
                    y - 0.2,
                    marker="v",
                    color="#b2182b",
                    ms=7,
                    label="ipvsctl deleted the real server",
                )
                ax.text(
                    r["t"] + 0.4,
                    y - 0.2,
                    str(r.get("reason")),
                    fontsize=7,
                    va="center",
                    color="#b2182b",
                )
    # traffic
    ok = [r for r in doc["short"] if r["ok"]]
    bad = [r for r in doc["short"] if not r["ok"]]
    ax.scatter(
        [r["start"] for r in ok],
        [0.1] * len(ok),
        s=4,
        color="#999999",
        label="short request answered",
    )
    ax.scatter(
        [r["start"] for r in bad],
        [0.1] * len(bad),
        s=30,
        color="#d7191c",
        marker="x",
        label="short request failed",
    )
    breaks = doc["long"]["breaks"]
    ax.scatter(
        [b[0] for b in breaks],
        [-0.4] * len(breaks),
        s=60,
        color="#d7191c",
        marker="*",
        label="long-lived connection broken",
    )
    for r in doc["long"]["records"]:
        if r["ok"]:
            ax.plot(r["start"], -0.4, marker="|", color="#4d4d4d", ms=5)
    ylabels += [(0.1, "short requests"), (-0.4, "long-lived conns")]
    bottom = -0.9
    half = doc.get("half_closed")
    if half and half.get("ticks"):
        ax.scatter(
            half["ticks"],
            [-0.9] * len(half["ticks"]),
            s=6,
            color="#1b7837",
            marker="|",
            label="half-closed download: data received",
        )
        if half.get("half_closed") is not None:
            ax.plot(
                half["half_closed"],
                -0.9,
                marker=">",
                color="#1b7837",
                ms=6,
                label="client shut its write side (FIN)",
            )
        ylabels.append((-0.9, f"half-closed\n({half.get('pod')})"))
        bottom = -1.4
    ax.set_yticks([y for y, _ in ylabels], [label for _, label in ylabels], fontsize=7)
    ax.set_ylim(bottom, len(pods) + 0.6)
    ax.set_xlim(-3, end + 1)
    ax.axvspan(
        doc["phases"]["rollout_start"], doc["phases"]["rollout_end"], color="#eeeeee", zorder=-1
    )
    title = {
        "drain": "draining ON (ipvsctl as shipped)",
        "nodrain": "draining OFF (real servers deleted at once)",
        "halfclose": "draining ON, with a half-closed download",
    }.get(doc["mode"], doc["mode"])
    ax.set_title(
        f"{title}: {summary['short_failed']}/{summary['short_sent']} short requests "
        f"failed, {summary['long_broken']} breaks of the {summary['long_lived']} "
        f"long-lived connections",
        fontsize=10,
    )
    ax.grid(axis="x", alpha=0.3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.plot")
    p.add_argument("--in", dest="inp", default=str(REPO / "out" / "demo" / "rollout.json"))
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(args.inp).read_text())
    docs, summaries = data["modes"], data["summary"]
    fig, axes = plt.subplots(
        len(docs), 1, figsize=(13, 4.2 * len(docs)), squeeze=False, sharex=True
    )
    for doc, s, ax in zip(docs, summaries, axes[:, 0], strict=True):
        draw(doc, s, ax)
    axes[-1, 0].set_xlabel("seconds since start (grey band: the rolling update)")
    handles, labels = [], []
    for ax in axes[:, 0]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(
        f"ipvsctl rolling update, kernel {data.get('kernel', '?')}: three v1 pods "
        "replaced by v2 behind 10.96.0.10:80",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 0.97))
    out = Path(args.out) if args.out else Path(args.inp).with_name("timeline.png")
    fig.savefig(out, dpi=110)
    print(f"demo: timeline written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
