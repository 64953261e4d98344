// The Vigil dashboard: connects this browser's camera and microphone (WebRTC) or watches a server-side source
// (WebSocket), and shows what the server sends (docs/protocol.md). Plain ES modules, no build step.
//
// Everything the page shows is also kept in ``window.vigilState`` so that tests (and curious people) can read
// the page's state instead of decoding pixels.

import { Api, ApiError } from "./api.js";
import { BarChart, LineChart } from "./charts.js";
import { SourceLink, WebRtcLink } from "./links.js";
import { Overlay } from "./overlay.js";
import { Timeline } from "./timeline.js";
import { SearchPanel } from "./search.js";
import { FacesPanel } from "./faces.js";

const $ = (id) => document.getElementById(id);
const RECONNECT_DELAYS_S = [1, 2, 4, 8, 8];
const HEALTH_POLL_MS = 4000;
const SOURCES_POLL_MS = 3000;
const STATS_POLL_MS = 500;
const VOICE_ERROR_CODES = new Set(["audio_silent", "turn_too_long", "stt_failed", "llm_unavailable", "reply_failed"]);
const STATE_LABELS = {
  idle: "Not connected", connecting: "Connecting…", live: "Live", reconnecting: "Reconnecting…",
  failed: "Failed", ended: "Ended",
};

const state = {
  connection: { state: "idle", reason: "", mode: null, sessionId: null, sourceId: null, attempt: 0 },
  server: { reachable: null, version: null },
  auth: { status: "unknown" }, // unknown | ok | needed | wrong
  hello: null,
  models: {},
  config: null,
  detections: { frames: 0, last: null },
  drawn: { boxes: 0, labels: [], keypoints: 0, zones: 0, lines: 0 },
  events: [],
  conversation: [], // {turn, role: "user"|"assistant", text, final|done, interrupted, bargedIn}
  bargeIns: 0,
  partialsShown: 0, // partial transcripts rendered (greyed) before their final
  turnMetrics: [],
  frameLatency: [],
  media: null,
  replyAudio: { audioLevel: 0, totalAudioEnergy: 0, packetsReceived: 0, playing: false },
  sources: [], // the server-side sources listed
  sourceState: null, // the watched source's last source.state data
  errors: [], // {code, message, at}: everything shown to the user as an error
  banner: null,
  messages: 0,
  micMuted: false,
  speakerMuted: false,
};
window.vigilState = state;

const api = new Api();
// "this is …" / "not this person" on the timeline change who is known: the people panel shows it.
const timeline = new Timeline(api, state, $("timeline-panel"), { onPeopleChanged: () => faces.load() });
const overlay = new Overlay($("overlay"), $("video"));
const turnChart = new BarChart($("turn-chart"), $("turn-legend"), [
  { name: "final transcript", colour: "#60a5fa" },
  { name: "LLM first token", colour: "#c084fc" },
  { name: "first reply audio", colour: "#fbbf24" },
  { name: "voice-to-voice", colour: "#4ade80" },
], { groups: 8, unit: " ms" });
const latencyChart = new LineChart($("latency-chart"), $("latency-legend"), [
  { name: "inference", colour: "#60a5fa" },
  { name: "end-to-end (queue + inference + delivery)", colour: "#4ade80" },
], { unit: " ms" });
const framesChart = new LineChart($("frames-chart"), $("frames-legend"), [
  { name: "received", colour: "#94a3b8" },
  { name: "analysed", colour: "#4ade80" },
  { name: "dropped", colour: "#f87171" },
], { unit: "/s" });

let link = null; // the WebRtcLink or SourceLink in use
let localStream = null;
let replyAudio = null;
let reconnectTimer = null;
let previousCounts = null;
let fpsChosen = false;

// ---------------------------------------------------------------- status, banner, errors

function setConnection(next, reason = "") {
  Object.assign(state.connection, { state: next, reason });
  document.body.dataset.connection = next;
  $("status").dataset.state = next;
  $("status-text").textContent = STATE_LABELS[next] || next;
  $("status-reason").textContent = reason;
  $("status-reason").title = reason;
  const busy = next === "connecting" || next === "live" || next === "reconnecting";
  $("connect").hidden = busy && state.connection.mode === "browser";
  $("disconnect").hidden = !(busy && state.connection.mode === "browser");
  $("connect").disabled = busy;
  $("mute-mic").disabled = !(busy && localStream && localStream.getAudioTracks().length);
}

function showBanner(message, { level = "error", code = "" } = {}) {
  state.banner = message ? { message, level, code } : null;
  const banner = $("banner");
  banner.hidden = !message;
  banner.textContent = message || "";
  banner.dataset.level = level;
  banner.dataset.code = code;
}

function reportError(code, message, { banner = true } = {}) {
  state.errors.push({ code, message, at: Date.now() });
  if (state.errors.length > 50) state.errors.shift();
  if (banner) showBanner(message, { code });
}

// ---------------------------------------------------------------- auth and server health

function askForToken(errorText) {
  const dialog = $("token-dialog");
  $("token-error").textContent = errorText || "";
  if (!dialog.open) dialog.showModal();
  $("token-input").focus();
}

async function checkServer() {
  try {
    const health = await api.request("/healthz");
    // /healthz answers anyone (a liveness probe); its details only with the token: without them, the token is
    // missing or wrong, and a protected route's 401 says which.
    if (health.version === undefined) await api.request("/api/sessions");
    state.server = { reachable: true, version: health.version };
    state.auth.status = "ok";
    const plural = (n, noun) => `${n} ${noun}${n === 1 ? "" : "s"}`;
    $("server-info").textContent =
      `server ${health.version} · ${plural(health.sessions, "session")} · ${plural(health.sources, "source")}`;
    if (state.banner && (state.banner.code === "unreachable" || state.banner.code === "unauthorized")) showBanner(null);
    return true;
  } catch (error) {
    if (!(error instanceof ApiError)) throw error;
    if (error.unauthorized) {
      state.server.reachable = true;
      const wrong = Boolean(api.token);
      state.auth.status = wrong ? "wrong" : "needed";
      const message = wrong
        ? `The server rejected the token (${error.message}). Enter the right one.`
        : "This server needs an access token.";
      reportError("unauthorized", message);
      askForToken(wrong ? "Wrong token: the server rejected it. Check auth.token in the server's config." : "");
    } else {
      state.server.reachable = false;
      $("server-info").textContent = "";
      reportError(error.code, error.message);
    }
    return false;
  }
}

$("token-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  api.setToken($("token-input").value.trim());
  $("token-button").hidden = false;
  $("token-error").textContent = "checking…";
  if (await checkServer()) {
    $("token-dialog").close();
    refreshSources();
    faces.load();
  }
});
$("token-button").addEventListener("click", () => askForToken(""));

// ---------------------------------------------------------------- devices

async function listDevices() {
  if (!navigator.mediaDevices?.enumerateDevices) return;
  const devices = await navigator.mediaDevices.enumerateDevices();
  for (const [select, kind, noun] of [[$("camera-select"), "videoinput", "camera"],
    [$("mic-select"), "audioinput", "microphone"]]) {
    const chosen = select.value;
    const options = [new Option(`default ${noun}`, "")];
    devices.filter((d) => d.kind === kind && d.deviceId).forEach((device, index) => {
      options.push(new Option(device.label || `${noun} ${index + 1}`, device.deviceId));
    });
    options.push(new Option(`no ${noun}`, "off"));
    select.replaceChildren(...options);
    if ([...select.options].some((o) => o.value === chosen)) select.value = chosen;
  }
}

function mediaErrorMessage(error) {
  const what = "camera or microphone";
  switch (error.name) {
    case "NotAllowedError":
    case "SecurityError":
      return `Permission to use the ${what} was denied. Allow it for this site (the camera icon in the address ` +
        "bar), then press Connect again, or watch a server-side source instead.";
    case "NotFoundError":
    case "OverconstrainedError":
      return `No ${what} matching your choice was found. Pick another device or "no camera" / "no microphone".`;
    case "NotReadableError":
      return `The ${what} is in use by another application or cannot be started.`;
    default:
      return `Cannot open the ${what}: ${error.message || error.name}`;
  }
}

// ---------------------------------------------------------------- connecting

function resetView() {
  overlay.clear();
  state.detections = { frames: 0, last: null };
  state.hello = null;
  previousCounts = null;
  $("object-summary").textContent = "No detections yet";
  $("frame-counts").textContent = "";
  $("events").replaceChildren();
}

async function connectBrowser() {
  const cameraChoice = $("camera-select").value;
  const micChoice = $("mic-select").value;
  if (cameraChoice === "off" && micChoice === "off") {
    reportError("no_media", "Choose a camera, a microphone or both before connecting.");
    return;
  }
  disconnect();
  resetView();
  state.connection.mode = "browser";
  state.connection.sourceId = null;
  setConnection("connecting", "checking the server");
  showBanner(null);
  // Ask the server first: no point asking for the camera if the server is down or the token is wrong.
  if (!(await checkServer())) {
    setConnection("failed", state.banner ? state.banner.message : "the server is not available");
    return;
  }
  // Start reply playback inside this click, so the browser's autoplay policy allows it.
  replyAudio = replyAudio || new Audio();
  replyAudio.autoplay = true;
  replyAudio.muted = state.speakerMuted;
  replyAudio.play().catch(() => {});
  setConnection("connecting", "asking for the camera and microphone");
  try {
    localStream = await navigator.mediaDevices.getUserMedia({
      video: cameraChoice === "off" ? false : { deviceId: cameraChoice || undefined, width: 640, height: 480 },
      audio: micChoice === "off" ? false : {
        deviceId: micChoice || undefined, echoCancellation: true, noiseSuppression: true, autoGainControl: true,
      },
    });
  } catch (error) {
    const message = mediaErrorMessage(error);
    reportError(error.name === "NotAllowedError" ? "permission_denied" : "media_unavailable", message);
    setConnection("failed", message);
    return;
  }
  listDevices();
  $("video").srcObject = localStream.getVideoTracks().length ? localStream : null;
  $("stage-empty").hidden = localStream.getVideoTracks().length > 0;
  $("video-caption").textContent = localStream.getVideoTracks()[0]?.label || "(no camera)";
  applyMicMute();
  await openBrowserLink(0);
}

async function openBrowserLink(attempt) {
  state.connection.attempt = attempt;
  if (attempt) setConnection("reconnecting", `attempt ${attempt} of ${RECONNECT_DELAYS_S.length}`);
  else setConnection("connecting", "opening the WebRTC session");
  const next = new WebRtcLink(api, {
    stream: localStream,
    // The server's default rate applies unless the user chose one before connecting.
    options: fpsChosen ? { video: { target_fps: Number($("fps").value) } } : undefined,
    onMessage: handleMessage,
    onTrack: (event) => {
      if (event.track.kind !== "audio") return;
      replyAudio.srcObject = new MediaStream([event.track]);
      replyAudio.play().catch(() => {});
    },
    onDrop: (reason, fatal) => dropped(next, reason, fatal),
    onRecovered: () => { if (link === next) setConnection("live", `session ${next.sessionId}`); },
  });
  link = next;
  try {
    await next.open();
  } catch (error) {
    next.close();
    if (link !== next) return; // the user went elsewhere meanwhile
    if (error instanceof ApiError && error.unauthorized) {
      await checkServer();
      setConnection("failed", error.message);
      return;
    }
    const message = error instanceof ApiError ? error.message : `Could not connect: ${error.message}`;
    if (attempt === 0 || attempt >= RECONNECT_DELAYS_S.length) {
      reportError(error.code || "connect_failed", message);
      setConnection("failed", message);
      return;
    }
    scheduleReconnect(attempt + 1, message);
    return;
  }
  if (link !== next) { next.close(); return; }
  state.connection.sessionId = next.sessionId;
  setConnection("live", `session ${next.sessionId}`);
  if (state.banner && state.banner.level === "error" && state.banner.code !== "unauthorized") showBanner(null);
}

function scheduleReconnect(attempt, reason) {
  const delay = RECONNECT_DELAYS_S[attempt - 1];
  const of = RECONNECT_DELAYS_S.length;
  setConnection("reconnecting", `${reason}; retrying in ${delay} s (attempt ${attempt} of ${of})`);
  clearTimeout(reconnectTimer);
  reconnectTimer = setTimeout(() => {
    if (state.connection.mode === "browser") openBrowserLink(attempt);
    else if (state.connection.mode === "source") openSourceLink(state.connection.sourceId, attempt);
  }, delay * 1000);
}

function dropped(which, reason, fatal, ended = false) {
  if (link !== which) return;
  if (ended) {
    setConnection("ended", reason);
    return;
  }
  if (!fatal) { // ICE may recover by itself
    setConnection("reconnecting", reason);
    return;
  }
  which.close();
  scheduleReconnect(1, reason);
}

function disconnect() {
  clearTimeout(reconnectTimer);
  if (link) link.close();
  link = null;
  if (localStream) localStream.getTracks().forEach((track) => track.stop());
  localStream = null;
  $("video").srcObject = null;
  if (replyAudio) replyAudio.srcObject = null;
  state.connection.sessionId = null;
  setConnection("idle", "");
}

$("connect").addEventListener("click", () => connectBrowser());
$("disconnect").addEventListener("click", () => { disconnect(); state.connection.mode = null; });

// ---------------------------------------------------------------- server-side sources

async function refreshSources() {
  if (state.auth.status !== "ok") return;
  let sources;
  try {
    ({ sources } = await api.request("/api/sources"));
  } catch {
    return; // the health check reports what is wrong
  }
  state.sources = sources;
  const body = $("sources").tBodies[0];
  if (!sources.length) {
    const row = body.insertRow();
    row.insertCell().textContent = "No server-side sources yet: add an RTSP camera or a file below.";
    body.replaceChildren(row);
    return;
  }
  body.replaceChildren(...sources.map((source) => {
    const row = document.createElement("tr");
    row.dataset.sourceId = source.id;
    row.classList.toggle("watching", source.id === state.connection.sourceId);
    const cells = [source.name || source.location, source.kind, source.state,
      `${source.counts.video.frames_in} frames`];
    for (const text of cells) row.insertCell().textContent = text;
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = source.id === state.connection.sourceId ? "Watching" : "Watch";
    button.className = "watch";
    button.onclick = () => watchSource(source.id, source.name || source.location);
    row.insertCell().append(button);
    return row;
  }));
}

async function watchSource(sourceId, title) {
  disconnect();
  resetView();
  state.connection.mode = "source";
  state.connection.sourceId = sourceId;
  $("stage-empty").hidden = false;
  $("stage-empty").textContent = "Waiting for the source's first analysed frame…";
  $("video-caption").textContent = `${title} (server-side: only the detections come to this page)`;
  const placeholder = $("conversation").querySelector(".placeholder");
  if (placeholder) {
    placeholder.textContent = "If this source has sound, what is said there and Vigil's replies appear here.";
  }
  await openSourceLink(sourceId, 0);
  refreshSources();
}

async function openSourceLink(sourceId, attempt) {
  if (attempt) setConnection("reconnecting", `attempt ${attempt} of ${RECONNECT_DELAYS_S.length}`);
  else setConnection("connecting", "opening the results stream");
  const next = new SourceLink(api, sourceId, {
    onMessage: handleMessage,
    onDrop: (reason, fatal, ended) => dropped(next, reason, fatal, ended),
  });
  link = next;
  try {
    await next.open();
  } catch (error) {
    next.close();
    if (link !== next) return;
    const message = error instanceof ApiError ? error.message : `Could not watch the source: ${error.message}`;
    if (attempt === 0 || attempt >= RECONNECT_DELAYS_S.length || error.status === 404) {
      reportError(error.code || "watch_failed", message);
      setConnection("failed", message);
      return;
    }
    scheduleReconnect(attempt + 1, message);
    return;
  }
  if (link === next) setConnection("live", `source ${sourceId}`);
}

$("add-source").addEventListener("submit", async (event) => {
  event.preventDefault();
  const value = $("source-location").value.trim();
  if (!value) return;
  const body = /^rtsps?:\/\//i.test(value) ? { url: value } : { path: value, loop: $("source-loop").checked };
  try {
    const source = await api.request("/api/sources", { method: "POST", body });
    $("source-location").value = "";
    await refreshSources();
    await watchSource(source.id, source.name || source.location);
  } catch (error) {
    reportError(error.code || "source_failed", `Cannot add that source: ${error.message}`);
  }
});

function selectTab(which) {
  $("tab-browser").setAttribute("aria-selected", String(which === "browser"));
  $("tab-server").setAttribute("aria-selected", String(which === "server"));
  $("pane-browser").hidden = which !== "browser";
  $("pane-server").hidden = which !== "server";
  if (which === "server") refreshSources();
}
$("tab-browser").addEventListener("click", () => selectTab("browser"));
$("tab-server").addEventListener("click", () => selectTab("server"));

// ---------------------------------------------------------------- controls

function applyMicMute() {
  if (localStream) localStream.getAudioTracks().forEach((track) => { track.enabled = !state.micMuted; });
  $("mute-mic").setAttribute("aria-pressed", String(state.micMuted));
  $("mute-mic").textContent = state.micMuted ? "Microphone muted: unmute" : "Mute microphone";
}
$("mute-mic").addEventListener("click", () => { state.micMuted = !state.micMuted; applyMicMute(); });
$("mute-speaker").addEventListener("click", () => {
  state.speakerMuted = !state.speakerMuted;
  if (replyAudio) replyAudio.muted = state.speakerMuted;
  $("mute-speaker").setAttribute("aria-pressed", String(state.speakerMuted));
  $("mute-speaker").textContent = state.speakerMuted ? "Replies muted: unmute" : "Mute replies";
});
$("fps").addEventListener("change", () => {
  const fps = Number($("fps").value);
  if (!(fps > 0 && fps <= 120)) {
    reportError("invalid_fps", "Frames per second must be between 0.5 and 120.");
    return;
  }
  fpsChosen = true;
  if (link) link.send({ v: 1, type: "config", video: { target_fps: fps } });
});

// ---------------------------------------------------------------- protocol messages

function handleMessage(message) {
  state.messages += 1;
  switch (message.type) {
    case "hello": onHello(message); break;
    case "detections": onDetections(message); break;
    case "transcript": onTranscript(message); break;
    case "reply": onReply(message); break;
    case "event": onEvent(message); timeline.onEvent(message); break;
    case "clip": timeline.onClip(message); break;
    case "metrics": onMetrics(message); break;
    case "error": onServerError(message); break;
    default: break; // protocol v1 is additive: ignore what we do not know
  }
}

function onHello(message) {
  state.hello = message;
  state.models = message.models || {};
  applyConfig(message.config);
  // Model and backend names next to what they produce; "counting-only" means that stage is switched off.
  const describe = (name, off) => (!name ? "" : name === "counting-only" ? off : name);
  $("video-model").textContent = describe(state.models.video, "no detector configured (frames are only counted)");
  $("voice-model").textContent = describe(state.models.audio, "voice loop off").replaceAll("+", " · ");
  const placeholder = $("conversation").querySelector(".placeholder");
  if (placeholder && state.models.audio === "counting-only") {
    placeholder.textContent = "The voice loop is off on this server (voice.enabled), so nothing is transcribed.";
  }
}

function applyConfig(config) {
  if (!config) return;
  state.config = config;
  overlay.setScene(config.video || {});
  if (document.activeElement !== $("fps")) $("fps").value = config.video.target_fps;
}

function onDetections(message) {
  state.detections.frames += 1;
  state.detections.last = {
    pts: message.pts, width: message.width, height: message.height, model: message.model,
    objects: message.objects, receivedAt: Date.now(),
  };
  overlay.setDetections(message);
  state.drawn = overlay.lastDrawn;
  if (state.connection.mode === "source") $("stage-empty").hidden = true;
  const counts = {};
  for (const object of message.objects) counts[object.label] = (counts[object.label] || 0) + 1;
  const parts = Object.entries(counts).map(([label, n]) => `${n} ${label}${n === 1 ? "" : "s"}`);
  $("object-summary").textContent = parts.length ? `Seeing ${parts.join(", ")}` : "Nothing detected";
  // Delivery time needs the two clocks to agree; it is only counted when they plausibly do (same machine/NTP).
  const deliveryMs = Date.now() - message.ts * 1000;
  const endToEnd = message.queue_ms + message.inference_ms + (deliveryMs >= 0 && deliveryMs < 5000 ? deliveryMs : 0);
  state.frameLatency.push({ inference_ms: message.inference_ms, end_to_end_ms: endToEnd });
  if (state.frameLatency.length > 120) state.frameLatency.shift();
  latencyChart.push([message.inference_ms, endToEnd]);
}

function conversationList() {
  const list = $("conversation");
  const placeholder = list.querySelector(".placeholder");
  if (placeholder) placeholder.remove();
  return list;
}

function entry(turn, role) {
  // Turn numbers start again in every session (a reconnect opens a new one): key entries by session too.
  const session = state.hello ? state.hello.session : null;
  let item = state.conversation.find((e) => e.session === session && e.turn === turn && e.role === role);
  if (!item) {
    item = { session, turn, role, text: "", final: false, done: false, interrupted: false, bargedIn: false };
    state.conversation.push(item);
    const li = document.createElement("li");
    li.className = role;
    li.dataset.turn = String(turn);
    li.dataset.role = role;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = role === "user" ? `You · turn ${turn}` : "Vigil";
    const text = document.createElement("span");
    text.className = "text";
    li.append(who, text);
    conversationList().append(li);
    item.element = li;
    Object.defineProperty(item, "element", { enumerable: false }); // keep vigilState JSON-serialisable
  }
  return item;
}

function scrollConversation() {
  const list = $("conversation");
  list.scrollTop = list.scrollHeight;
}

function onTranscript(message) {
  const item = entry(message.turn, "user");
  if (item.final && !message.final) return;
  item.text = message.text;
  item.final = message.final;
  item.element.classList.toggle("partial", !message.final);
  if (!message.final) state.partialsShown += 1;
  item.element.querySelector(".text").textContent = message.text || "…";
  scrollConversation();
}

function onReply(message) {
  const item = entry(message.turn, "assistant");
  if (message.delta) item.text += message.delta;
  if (message.done) item.done = true;
  if (message.interrupted) item.interrupted = true; // cut short (a barge-in or a newer turn), not finished
  item.element.classList.toggle("streaming", !item.done && !item.bargedIn);
  item.element.querySelector(".text").textContent = item.text;
  scrollConversation();
}

let bargeTimer = null;
let flashTimer = null;

function onEvent(message) {
  const data = message.data || {};
  if (message.name === "config") { applyConfig(data); return; }
  if (message.name === "source.state") { onSourceState(data); return; }
  state.events.push({ name: message.name, data, pts: message.pts });
  if (state.events.length > 100) state.events.shift();
  if (message.name === "barge_in") {
    state.bargeIns += 1;
    const session = state.hello ? state.hello.session : null;
    const item = state.conversation.find(
      (e) => e.session === session && e.turn === data.turn && e.role === "assistant");
    if (item) {
      item.bargedIn = true;
      // Cut either way: while being generated (its reply also says interrupted) or after its text was done,
      // while its audio played (the rest was dropped, data.dropped_audio_ms).
      item.interrupted = true;
      item.element.classList.add("barged");
      item.element.classList.remove("streaming");
    }
    $("barge-in").hidden = false;
    $("speaking").hidden = true; // the server has cut the reply audio
    clearTimeout(bargeTimer);
    bargeTimer = setTimeout(() => { $("barge-in").hidden = true; }, 4000);
    return;
  }
  const place = data.zone || data.line;
  if (place) {
    overlay.flash(place);
    const verb = { "zone.enter": "entered", "zone.exit": "left", "line.cross": `crossed (${data.direction})` };
    const text = `${data.label || "object"} #${data.track_id ?? "?"} ${verb[message.name] || message.name} ${place}`;
    $("zone-flash").textContent = text;
    $("zone-flash").hidden = false;
    clearTimeout(flashTimer);
    flashTimer = setTimeout(() => { $("zone-flash").hidden = true; }, 1500);
    const li = document.createElement("li");
    li.textContent = `${message.pts != null ? `${message.pts.toFixed(1)} s  ` : ""}${text}`;
    $("events").prepend(li);
    while ($("events").children.length > 20) $("events").lastChild.remove();
  }
}

function onSourceState(data) {
  if (state.connection.mode !== "source") return;
  state.sourceState = data;
  const detail = data.reason ? `: ${data.reason}` : "";
  switch (data.state) {
    case "live": setConnection("live", `source ${state.connection.sourceId}`); break;
    case "connecting": setConnection("connecting", "the server is opening the source"); break;
    case "reconnecting":
      setConnection("reconnecting", `the camera dropped${detail}; attempt ${data.attempt ?? "?"}, ` +
        `retry in ${data.retry_in_s ?? "?"} s`);
      break;
    case "failed": setConnection("failed", `the source failed${detail}`); reportError("source_failed",
      `The server could not read this source${detail}`); break;
    case "ended": case "stopped": setConnection("ended", `the source ${data.state}`); break;
    default: break;
  }
}

function onMetrics(message) {
  if (message.turn) {
    const t = message.turn;
    state.turnMetrics.push(t);
    turnChart.push(`turn ${t.turn}`, [t.end_of_speech_to_final_ms, t.llm_first_token_ms, t.first_audio_ms,
      t.voice_to_voice_ms].map((v) => (v == null ? NaN : v)));
  }
  if (message.media) {
    state.media = message.media;
    const v = message.media.video;
    $("frame-counts").textContent =
      `${v.frames_in} frames received · ${v.frames_analyzed} analysed · ${v.frames_dropped} dropped`;
    const now = performance.now();
    if (previousCounts) {
      const seconds = (now - previousCounts.at) / 1000;
      if (seconds > 0) {
        framesChart.push([(v.frames_in - previousCounts.v.frames_in) / seconds,
          (v.frames_analyzed - previousCounts.v.frames_analyzed) / seconds,
          (v.frames_dropped - previousCounts.v.frames_dropped) / seconds]);
      }
    }
    previousCounts = { at: now, v };
  }
}

function onServerError(message) {
  if (message.code === "audio_silent" && state.micMuted) return; // silence is what muting sends
  const text = `${message.message} (${message.code})`;
  reportError(message.code, text, { banner: !VOICE_ERROR_CODES.has(message.code) });
  if (VOICE_ERROR_CODES.has(message.code)) {
    const li = document.createElement("li");
    li.className = "error";
    li.textContent = text;
    conversationList().append(li);
    scrollConversation();
  }
}

// ---------------------------------------------------------------- reply audio level (WebRTC stats)

async function pollStats() {
  if (!link) return;
  const report = await link.stats();
  if (!report) return;
  report.forEach((stat) => {
    if (stat.type === "inbound-rtp" && stat.kind === "audio") {
      const level = stat.audioLevel ?? 0;
      state.replyAudio = {
        audioLevel: level,
        totalAudioEnergy: stat.totalAudioEnergy ?? 0,
        packetsReceived: stat.packetsReceived ?? 0,
        maxAudioLevel: Math.max(state.replyAudio.maxAudioLevel || 0, level),
        playing: level > 0.01,
      };
      $("reply-level").style.width = `${Math.min(100, Math.sqrt(level) * 100)}%`;
      $("speaking").hidden = !(level > 0.01);
    }
  });
}

// ---------------------------------------------------------------- start

setConnection("idle", "");
new SearchPanel({
  api, state, form: $("search-form"), input: $("search-input"), kind: $("search-kind"),
  results: $("search-results"), player: $("search-clip"),
  onError: (error) => (error instanceof ApiError && error.unauthorized ? askForToken(error.message)
    : reportError(error.code, `Search failed: ${error.message}`, { banner: false })),
});
const faces = new FacesPanel({
  api, state, form: $("faces-form"), name: $("faces-name"), file: $("faces-file"), list: $("faces-list"),
  status: $("faces-status"), known: $("faces-known"),
  onError: (error) => (error instanceof ApiError && error.unauthorized ? askForToken(error.message)
    : reportError(error.code, `People: ${error.message}`, { banner: false })),
});
listDevices();
navigator.mediaDevices?.addEventListener?.("devicechange", listDevices);
checkServer().then((ok) => { if (ok) { refreshSources(); timeline.load(); faces.load(); } });
setInterval(() => { if (!$("token-dialog").open) checkServer(); }, HEALTH_POLL_MS);
setInterval(() => { if (!$("pane-server").hidden) refreshSources(); }, SOURCES_POLL_MS);
setInterval(() => { pollStats().catch(() => {}); }, STATS_POLL_MS);
state.ready = true;
