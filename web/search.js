// Search box over the server's memory (GET /api/search): what sessions and sources saw and heard. A result with
// an event or clip id jumps to it (the timeline's clip, played in place); any other result jumps to its session
// or source in the page (flashing the matching event line when it is on screen).

const KIND_LABELS = { transcript: "heard", reply: "said", event: "event", scene: "scene", alert: "alert",
  document: "document" };

export class SearchPanel {
  constructor({ api, state, form, input, kind, results, player, onError }) {
    this.api = api;
    this.state = state;
    this.input = input;
    this.kind = kind;
    this.results = results;
    this.player = player;
    this.onError = onError;
    state.search = { query: "", results: [], error: null, selected: null, searching: false };
    form.addEventListener("submit", (event) => { event.preventDefault(); this.search(); });
  }

  async search() {
    const query = this.input.value.trim();
    const s = this.state.search;
    s.query = query;
    s.error = null;
    if (!query) { this.render([]); return; }
    const params = new URLSearchParams({ q: query, limit: "20" });
    if (this.kind.value) params.set("kind", this.kind.value);
    s.searching = true;
    try {
      const body = await this.api.request(`/api/search?${params}`);
      s.results = body.results;
      this.render(body.results);
    } catch (error) {
      s.error = { code: error.code, message: error.message };
      s.results = [];
      this.render([], error.message);
      this.onError(error);
    } finally {
      s.searching = false;
    }
  }

  render(results, error = "") {
    const items = results.map((result, index) => {
      const li = document.createElement("li");
      li.dataset.index = String(index);
      li.dataset.kind = result.kind;
      const when = new Date(result.wall_time * 1000).toLocaleString();
      const where = result.media_time != null ? ` @ ${result.media_time.toFixed(1)} s` : "";
      const meta = document.createElement("span");
      meta.className = "muted";
      meta.textContent = `${when} · ${KIND_LABELS[result.kind] || result.kind} · ${result.source}${where}`;
      const text = document.createElement("span");
      text.textContent = result.text;
      li.append(meta, text);
      li.tabIndex = 0;
      li.addEventListener("click", () => this.open(result, li));
      li.addEventListener("keydown", (event) => { if (event.key === "Enter") this.open(result, li); });
      return li;
    });
    if (!items.length) {
      const li = document.createElement("li");
      li.className = "placeholder";
      li.textContent = error || (this.state.search.query ? "Nothing found." : "");
      items.push(li);
    }
    this.results.replaceChildren(...items);
  }

  /** Jump to what the result is about: its clip when the timeline has one, else its session or source. */
  open(result, element) {
    for (const li of this.results.children) li.classList.toggle("selected", li === element);
    const target = { id: result.id, source: result.source, event_id: result.event_id, clip_id: result.clip_id,
      shown: "source" };
    if (result.event_id) {
      const token = this.api.token ? `?token=${encodeURIComponent(this.api.token)}` : "";
      this.player.src = `/api/events/${encodeURIComponent(result.event_id)}/clip.mp4${token}`;
      this.player.hidden = false;
      this.player.play().catch(() => {});
      target.shown = "clip";
    } else {
      this.player.hidden = true;
      this.player.removeAttribute("src");
      const row = document.querySelector(`[data-source-id="${CSS.escape(result.source)}"]`);
      if (row) { row.scrollIntoView({ block: "nearest" }); row.classList.add("flash"); }
      target.shown = row ? "source" : "none";
    }
    this.state.search.selected = target;
  }
}
