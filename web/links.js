// The two ways results reach the page: a WebRTC session (this browser's camera and mic) and a WebSocket
// (a server-side source). Both hand every protocol message (docs/protocol.md) to ``onMessage``.

const RESULTS_LABEL = "results";

function iceGatheringDone(pc, timeoutMs) {
  // Vigil's /offer takes one complete offer (no trickle ICE), so wait for the candidates first.
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => { pc.removeEventListener("icegatheringstatechange", check); clearTimeout(timer); resolve(); };
    const check = () => { if (pc.iceGatheringState === "complete") done(); };
    const timer = setTimeout(done, timeoutMs);
    pc.addEventListener("icegatheringstatechange", check);
  });
}

export class WebRtcLink {
  /**
   * @param {import("./api.js").Api} api
   * @param {{stream: MediaStream, options: object, onMessage: Function, onDrop: Function, onTrack: Function}} hooks
   */
  constructor(api, { stream, options, onMessage, onDrop, onTrack, onRecovered }) {
    this.api = api;
    this.stream = stream;
    this.options = options;
    this.onMessage = onMessage;
    this.onDrop = onDrop;
    this.onTrack = onTrack;
    this.onRecovered = onRecovered;
    this.pc = null;
    this.channel = null;
    this.sessionId = null;
    this.closed = false;
  }

  async open(timeoutMs = 20000) {
    const pc = new RTCPeerConnection({ iceServers: [] });
    this.pc = pc;
    const channel = pc.createDataChannel(RESULTS_LABEL);
    this.channel = channel;
    channel.onmessage = (event) => this.onMessage(JSON.parse(event.data));
    for (const track of this.stream.getTracks()) pc.addTrack(track, this.stream);
    pc.ontrack = (event) => this.onTrack(event);
    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringDone(pc, 3000);
    const answer = await this.api.request("/offer", {
      method: "POST", body: { sdp: pc.localDescription.sdp, type: "offer", options: this.options },
    });
    this.sessionId = answer.session_id;
    await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(
        `no results channel after ${timeoutMs / 1000} s (WebRTC could not connect: ICE ${pc.iceConnectionState})`)),
      timeoutMs);
      if (channel.readyState === "open") { clearTimeout(timer); resolve(); return; }
      channel.onopen = () => { clearTimeout(timer); resolve(); };
    });
    pc.onconnectionstatechange = () => {
      if (this.closed) return;
      if (pc.connectionState === "failed" || pc.connectionState === "closed") {
        this.onDrop(`WebRTC connection ${pc.connectionState}`, true);
      } else if (pc.connectionState === "disconnected") {
        this.onDrop("WebRTC connection interrupted", false);
      } else if (pc.connectionState === "connected") {
        this.onRecovered(); // ICE found its way back after an interruption
      }
    };
    channel.onclose = () => { if (!this.closed) this.onDrop("the server closed the session", true); };
  }

  send(message) {
    if (this.channel && this.channel.readyState === "open") this.channel.send(JSON.stringify(message));
  }

  async stats() {
    return this.pc ? this.pc.getStats() : null;
  }

  close() {
    this.closed = true;
    if (this.channel) this.channel.close();
    if (this.pc) this.pc.close();
  }
}

export class SourceLink {
  constructor(api, sourceId, { onMessage, onDrop }) {
    this.api = api;
    this.sourceId = sourceId;
    this.onMessage = onMessage;
    this.onDrop = onDrop;
    this.socket = null;
    this.closed = false;
  }

  async open(timeoutMs = 10000) {
    // Check over HTTP first: a WebSocket that fails to upgrade (401, 404) tells the page nothing about why.
    await this.api.request(`/api/sources/${encodeURIComponent(this.sourceId)}`);
    const socket = new WebSocket(this.api.webSocketUrl(`/api/sources/${encodeURIComponent(this.sourceId)}/results`));
    this.socket = socket;
    socket.onmessage = (event) => this.onMessage(JSON.parse(event.data));
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("the results WebSocket did not open")), timeoutMs);
      socket.onopen = () => { clearTimeout(timer); resolve(); };
      socket.onerror = () => { clearTimeout(timer); reject(new Error("the results WebSocket failed to open")); };
    });
    socket.onclose = (event) => {
      if (this.closed) return;
      if (event.code === 1000) this.onDrop(`source ended: ${event.reason || "stopped"}`, false, true);
      else this.onDrop(event.reason ? `results stream closed: ${event.reason}` : "lost the results stream", true);
    };
  }

  send(message) {
    if (this.socket && this.socket.readyState === WebSocket.OPEN) this.socket.send(JSON.stringify(message));
  }

  async stats() { return null; }

  close() {
    this.closed = true;
    if (this.socket) this.socket.close();
  }
}
