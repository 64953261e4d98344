// People the server recognises (video.faces): list them, enrol one from a photo of their face, delete one
// (every photo and embedding of theirs). POST /api/faces/{name} takes the photo as the raw body.

export class FacesPanel {
  constructor({ api, state, form, name, file, list, status, onError }) {
    this.api = api;
    this.state = state;
    this.name = name;
    this.file = file;
    this.list = list;
    this.status = status;
    this.onError = onError;
    state.faces = { people: [], error: null };
    form.addEventListener("submit", (event) => { event.preventDefault(); this.enrol(); });
  }

  async load() {
    try {
      const body = await this.api.request("/api/faces");
      this.state.faces.people = body.people;
      this.render();
    } catch (error) {
      this.onError(error);
    }
  }

  async enrol() {
    const name = this.name.value.trim();
    const photo = this.file.files[0];
    if (!name || !photo) { this.say("A name and a photo of their face are needed."); return; }
    const headers = { "Content-Type": photo.type || "application/octet-stream" };
    if (this.api.token) headers.Authorization = `Bearer ${this.api.token}`;
    const response = await fetch(`/api/faces/${encodeURIComponent(name)}`, { method: "POST", headers, body: photo });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      this.state.faces.error = body.error || { code: `http_${response.status}` };
      this.say(`Not enrolled: ${body.error ? body.error.message : response.statusText}`);
      return;
    }
    this.state.faces.error = null;
    this.say(`${body.name}: ${body.faces} photo(s) enrolled.`);
    this.file.value = "";
    await this.load();
  }

  async remove(name) {
    try {
      await this.api.request(`/api/faces/${encodeURIComponent(name)}`, { method: "DELETE" });
      this.say(`${name} deleted, with every photo of theirs.`);
      await this.load();
    } catch (error) {
      this.onError(error);
    }
  }

  say(text) { this.status.textContent = text; }

  render() {
    this.list.replaceChildren(...this.state.faces.people.map((person) => {
      const item = document.createElement("li");
      item.textContent = `${person.name} (${person.faces}) `;
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = "delete";
      button.addEventListener("click", () => this.remove(person.name));
      item.append(button);
      return item;
    }));
  }
}
