// The dashboard's few behaviours: thumbnails that refresh, the live view over a WebSocket with take-over,
// and step-by-step replay of a recorded episode. No build step, no libraries.
"use strict";
const osfleet = {};

osfleet.refreshThumbs = function (periodMs) {
  setInterval(() => {
    document.querySelectorAll("img.thumb").forEach((img) => {
      const next = new Image();  // swap only once loaded: no flicker
      next.onload = () => { img.src = next.src; };
      next.src = img.dataset.src + "&t=" + Date.now();
    });
  }, periodMs);
};

// Keys the guest's hotkey action knows by name; everything else that is one printable character is typed.
const KEY_NAMES = {
  Enter: "enter", Escape: "esc", Backspace: "backspace", Tab: "tab", Delete: "delete", Insert: "insert",
  Home: "home", End: "end", PageUp: "pageup", PageDown: "pagedown", ArrowUp: "up", ArrowDown: "down",
  ArrowLeft: "left", ArrowRight: "right", " ": "space",
};

osfleet.liveView = function (rid) {
  const img = document.getElementById("screen"), box = document.getElementById("screen-box");
  const take = document.getElementById("take"), give = document.getElementById("give");
  const mode = document.getElementById("mode"), status = document.getElementById("live-status");
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const csrf = document.querySelector('meta[name="csrf"]').content;  // the session's: the socket changes state
  // The CSRF token is the socket's first message, never part of its URL (URLs end up in access logs).
  const ws = new WebSocket(`${scheme}//${location.host}/ui/ws/replicas/${encodeURIComponent(rid)}`);
  ws.binaryType = "blob";
  let taking = false, frames = 0;
  const send = (body) => ws.send(JSON.stringify(body));
  const setTaking = (on) => {
    taking = on;
    take.hidden = on; give.hidden = !on;
    mode.textContent = on ? "you are driving this replica" : "watching";
    box.classList.toggle("taking", on);
    if (on) box.focus();
  };
  ws.onopen = () => { send({ op: "hello", csrf }); status.textContent = "live"; };
  ws.onclose = () => { status.textContent = "disconnected"; setTaking(false); };
  ws.onmessage = (ev) => {
    if (typeof ev.data !== "string") {
      const old = img.src;
      img.src = URL.createObjectURL(ev.data);
      if (old) URL.revokeObjectURL(old);
      frames += 1;
      img.dataset.frames = String(frames);
      return;
    }
    const msg = JSON.parse(ev.data);
    if (msg.type === "status") setTaking(msg.taken_over);
    else if (msg.type === "error") status.textContent = msg.error;
    else if (msg.type === "acted") status.textContent = msg.results.every((r) => r.ok) ? "live" : "an action failed";
  };
  take.onclick = () => send({ op: "take" });
  give.onclick = () => send({ op: "give" });
  const at = (ev) => {
    const r = img.getBoundingClientRect();
    return {
      x: Math.max(0, Math.min(img.naturalWidth - 1, Math.round((ev.clientX - r.left) * img.naturalWidth / r.width))),
      y: Math.max(0, Math.min(img.naturalHeight - 1, Math.round((ev.clientY - r.top) * img.naturalHeight / r.height))),
    };
  };
  img.addEventListener("click", (ev) => { if (taking) send({ op: "act", actions: [{ type: "click", ...at(ev) }] }); });
  img.addEventListener("dblclick", (ev) => {
    if (taking) send({ op: "act", actions: [{ type: "double_click", ...at(ev) }] });
  });
  img.addEventListener("contextmenu", (ev) => {
    if (!taking) return;
    ev.preventDefault();
    send({ op: "act", actions: [{ type: "right_click", ...at(ev) }] });
  });
  img.addEventListener("wheel", (ev) => {
    if (!taking) return;
    ev.preventDefault();
    send({ op: "act", actions: [{ type: "scroll", ...at(ev), clicks: ev.deltaY > 0 ? 3 : -3 }] });
  }, { passive: false });
  box.addEventListener("keydown", (ev) => {
    if (!taking) return;
    const mods = [];
    if (ev.ctrlKey) mods.push("ctrl");
    if (ev.altKey) mods.push("alt");
    if (ev.metaKey) mods.push("super");
    let action = null;
    if (KEY_NAMES[ev.key]) action = { type: "hotkey", keys: [...mods, ...(ev.shiftKey ? ["shift"] : []), KEY_NAMES[ev.key]] };
    else if (/^F\d{1,2}$/.test(ev.key)) action = { type: "hotkey", keys: [...mods, ev.key.toLowerCase()] };
    else if (ev.key.length === 1 && mods.length) action = { type: "hotkey", keys: [...mods, ev.key.toLowerCase()] };
    else if (ev.key.length === 1) action = { type: "type", text: ev.key };
    if (action) { ev.preventDefault(); send({ op: "act", actions: [action] }); }
  });
};

osfleet.replay = function (tid, resetImage, steps) {
  const frame = document.getElementById("frame"), detail = document.getElementById("detail");
  const slider = document.getElementById("slider"), position = document.getElementById("position");
  const base = `/ui/trajectories/${encodeURIComponent(tid)}/images/`;
  let at = 0, timer = null;
  // Position 0 is the screen right after the reset; position i (1..n) is the screen after step i-1.
  const show = (i) => {
    at = Math.max(0, Math.min(steps.length, i));
    slider.value = String(at);
    const step = at > 0 ? steps[at - 1] : null;
    const image = step ? step.image : resetImage;
    if (image) frame.src = base + encodeURIComponent(image);
    frame.dataset.position = String(at);
    position.textContent = at === 0 ? `after reset (${steps.length} steps)` : `step ${at} of ${steps.length}`;
    detail.textContent = step
      ? JSON.stringify({ action_id: step.action_id, source: step.source, seconds: step.seconds, done: step.done,
          actions: step.actions, results: step.results, metadata: step.metadata }, null, 2)
      : "the observation after the reset";
  };
  document.getElementById("first").onclick = () => show(0);
  document.getElementById("prev").onclick = () => show(at - 1);
  document.getElementById("next").onclick = () => show(at + 1);
  slider.oninput = () => show(Number(slider.value));
  document.getElementById("play").onclick = (ev) => {
    if (timer) { clearInterval(timer); timer = null; ev.target.textContent = "Play"; return; }
    ev.target.textContent = "Pause";
    timer = setInterval(() => { if (at >= steps.length) { clearInterval(timer); timer = null; ev.target.textContent = "Play"; } else show(at + 1); }, 700);
  };
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "ArrowRight") show(at + 1);
    if (ev.key === "ArrowLeft") show(at - 1);
  });
  show(0);
};
