// The timeline panel: stored events (GET /api/events) with snapshot thumbnails, filters, and the event's clip
// played in place on a click. New events of the connected session or source appear live (their ``event`` message
// carries the stored id; a ``clip`` message says when its clip is ready); other streams' on the next poll.
// A person's event says who they are: "this is …" enrols the face from that event under a name (typed, or picked
// from the people already known), and "not this person" tells the server a recognised event named the wrong one.
// State for tests: ``window.vigilState.timeline``.

const POLL_MS = 5000;
const PAGE = 30;
const NAMES = {
  "zone.enter": "entered", "zone.exit": "left", "line.cross": "crossed", "object.appeared": "appeared",
};

export class Timeline {
  constructor(api, state, root, { onPeopleChanged = () => {} } = {}) {
    this.api = api;
    this.state = state;
    this.onPeopleChanged = onPeopleChanged;
    this.list = root.querySelector("#timeline");
    this.filters = {
      source: root.querySelector("#timeline-source"), name: root.querySelector("#timeline-name"),
      kind: root.querySelector("#timeline-kind"),
    };
    this.empty = root.querySelector("#timeline-empty");
    state.timeline = { items: [], playing: null, error: null, loaded: 0, live: 0 };
    for (const input of Object.values(this.filters)) input.addEventListener("change", () => this.load());
    setInterval(() => { if (document.visibilityState === "visible") this.load(); }, POLL_MS);
  }

  /** A URL the browser can load in <img>/<video> (they cannot send headers: the token goes in the query). */
  mediaUrl(path) {
    const url = new URL(path, location.href);
    if (this.api.token) url.searchParams.set("token", this.api.token);
    return url.toString();
  }

  query() {
    const params = new URLSearchParams({ limit: String(PAGE), kind: this.filters.kind.value || "event,alert" });
    if (this.filters.source.value) params.set("source", this.filters.source.value);
    if (this.filters.name.value) params.set("name", this.filters.name.value);
    return params;
  }

  async load() {
    let page;
    try {
      page = await this.api.request(`/api/events?${this.query()}`);
    } catch (error) {
      this.state.timeline.error = error.message; // e.g. storage off (404) or unavailable (503)
      this.empty.textContent = `Timeline unavailable: ${error.message}`;
      return;
    }
    this.state.timeline.error = null;
    this.state.timeline.loaded += 1;
    const playing = this.state.timeline.playing;
    const known = new Map(this.state.timeline.items.map((item) => [item.id, item]));
    this.state.timeline.items = page.events.map((event) => ({ ...known.get(event.id), ...event }));
    this.render(playing);
    this.refreshSources(page.events);
  }

  refreshSources(events) {
    const select = this.filters.source;
    const have = new Set([...select.options].map((o) => o.value));
    for (const event of events) {
      if (have.has(event.source)) continue;
      have.add(event.source);
      const option = document.createElement("option");
      option.value = event.source;
      option.textContent = event.source_name ? `${event.source_name} (${event.source})` : event.source;
      select.append(option);
    }
  }

  /** A live ``event`` message with a stored id: shown at once (the list reloads with the stored row later). */
  onEvent(message) {
    if (!message.id || this.state.timeline.items.some((item) => item.id === message.id)) return;
    if (this.filters.name.value && this.filters.name.value !== message.name) return;
    if (this.filters.source.value && this.filters.source.value !== message.session) return;
    this.state.timeline.live += 1;
    this.state.timeline.items.unshift({
      id: message.id, kind: "event", name: message.name, source: message.session, data: message.data || {},
      wall_ts: Date.now() / 1000, pts: message.pts, clip_state: "pending", live: true,
      snapshot_url: `/api/events/${message.id}/snapshot.jpg`,
    });
    this.render(this.state.timeline.playing);
  }

  /** A ``clip`` message: its events can now be played. */
  onClip(message) {
    for (const item of this.state.timeline.items) {
      if (message.event_ids.includes(item.id)) {
        item.clip_state = "ready";
        item.clip_url = message.url;
      }
    }
    this.render(this.state.timeline.playing);
  }

  render(playing) {
    const items = this.state.timeline.items;
    this.empty.hidden = items.length > 0;
    if (!items.length) this.empty.textContent = "No stored events yet.";
    const existing = new Map([...this.list.children].map((li) => [li.dataset.id, li]));
    const ordered = items.map((item) => {
      const li = existing.get(item.id) || this.row(item);
      this.update(li, item, playing);
      return li;
    });
    this.list.replaceChildren(...ordered);
  }

  row(item) {
    const li = document.createElement("li");
    li.dataset.id = item.id;
    li.innerHTML = `<div class="media"></div><div class="text"><b class="name"></b><span class="detail"></span>
      <span class="when muted"></span></div>`;
    li.addEventListener("click", () => this.play(item.id));
    if (item.kind === "event" && (item.data || {}).label === "person") li.append(this.faceActions(item.id));
    return li;
  }

  /** "this is …" and "not this person" under a person's event; built once per row, so that a name being typed
   * survives the polls' re-renders (``update`` only shows or hides "not this person"). */
  faceActions(id) {
    const actions = document.createElement("form");
    actions.className = "face-actions";
    actions.innerHTML = `<input class="who" type="text" list="faces-known" placeholder="this is …" size="12"
      maxlength="64" aria-label="who this is"><button type="submit" class="this-is">this is</button>
      <button type="button" class="not-this-person">not this person</button><span class="said muted"></span>`;
    // A click in the form is not a click on the row (which plays the clip).
    actions.addEventListener("click", (event) => event.stopPropagation());
    actions.addEventListener("submit", (event) => { event.preventDefault(); this.thisIs(id, actions); });
    actions.querySelector(".not-this-person").addEventListener("click", () => this.notThisPerson(id, actions));
    return actions;
  }

  async thisIs(id, actions) {
    const name = actions.querySelector(".who").value.trim();
    const said = actions.querySelector(".said");
    if (!name) { said.textContent = "Type or pick a name."; return; }
    try {
      const person = await this.api.request(`/api/faces/${encodeURIComponent(name)}`,
        { method: "POST", body: { event_id: id } });
      said.textContent = `Enrolled as ${person.name} (${person.faces} photo(s)).`;
      actions.querySelector(".who").value = "";
      this.onPeopleChanged();
    } catch (error) {
      said.textContent = `Not enrolled: ${error.message}`; // e.g. no face on the snapshot, an event without a box
    }
  }

  async notThisPerson(id, actions) {
    const said = actions.querySelector(".said");
    try {
      const marked = await this.api.request(`/api/events/${encodeURIComponent(id)}/not-this-person`,
        { method: "POST" });
      said.textContent = `Not ${marked.name}: this face will not be named ${marked.name} again.`;
      const item = this.state.timeline.items.find((i) => i.id === id);
      if (item) item.data = { ...item.data, identity: undefined }; // the server took the name from the event
      this.render(this.state.timeline.playing);
      this.onPeopleChanged();
    } catch (error) {
      said.textContent = `Not changed: ${error.message}`;
    }
  }

  update(li, item, playing) {
    const data = item.data || {};
    const place = data.zone || data.line || "";
    li.dataset.clip = item.clip_state;
    li.querySelector(".name").textContent = item.kind === "alert" ? "alert" : (NAMES[item.name] || item.name);
    li.querySelector(".detail").textContent = item.kind === "alert" ? ` “${item.text || ""}”`
      : ` ${data.label || ""}${data.track_id ? ` #${data.track_id}` : ""}${place ? ` · ${place}` : ""}`
        + (data.score != null ? ` · ${Math.round(data.score * 100)}%` : "")
        + (data.identity && data.identity.name ? ` · ${data.identity.name}` : "");
    const notThisPerson = li.querySelector(".not-this-person");
    if (notThisPerson) notThisPerson.hidden = !(data.identity && data.identity.name);
    const when = new Date(item.wall_ts * 1000).toLocaleTimeString();
    li.querySelector(".when").textContent = `${when} · ${item.source_name || item.source}`;
    const media = li.querySelector(".media");
    const wanted = playing === item.id && item.clip_url ? "video" : item.snapshot_url ? "img" : "none";
    if (media.dataset.showing === wanted) return;
    media.dataset.showing = wanted;
    if (wanted === "video") {
      const video = document.createElement("video");
      Object.assign(video, { controls: true, autoplay: true, muted: true, playsInline: true });
      video.src = this.mediaUrl(item.clip_url);
      media.replaceChildren(video);
    } else if (wanted === "img") {
      const img = document.createElement("img");
      img.alt = `${item.name} snapshot`;
      img.loading = "lazy";
      img.src = this.mediaUrl(item.snapshot_url);
      img.addEventListener("error", () => { // not written yet: try again on the next render
        img.hidden = true;
        media.dataset.showing = "retry";
      }, { once: true });
      media.replaceChildren(img);
    } else {
      media.replaceChildren();
    }
  }

  /** A click: the clip plays in place of the thumbnail (another click on the same row goes back). */
  play(id) {
    const item = this.state.timeline.items.find((i) => i.id === id);
    if (!item || !item.clip_url) return;
    this.state.timeline.playing = this.state.timeline.playing === id ? null : id;
    this.render(this.state.timeline.playing);
  }
}
