// People the server recognises (video.faces): list them, enrol one from a photo of their face, delete one
// (every photo and embedding of theirs), and open a person's page: the photos behind the name, each removable
// (a wrong photo makes wrong names). POST /api/faces/{name} takes the photo as the raw body.

export class FacesPanel {
  constructor({ api, state, form, name, file, list, status, known, onError }) {
    this.api = api;
    this.state = state;
    this.name = name;
    this.file = file;
    this.list = list;
    this.status = status;
    this.known = known;
    this.onError = onError;
    state.faces = { people: [], error: null, open: null, page: null };
    form.addEventListener("submit", (event) => { event.preventDefault(); this.enrol(); });
  }

  async load() {
    try {
      const body = await this.api.request("/api/faces");
      this.state.faces.people = body.people;
      const open = this.state.faces.open;
      if (open && !body.people.some((person) => person.name === open)) this.state.faces.open = null;
      this.state.faces.page = this.state.faces.open
        ? await this.api.request(`/api/faces/${encodeURIComponent(this.state.faces.open)}`) : null;
      this.render();
    } catch (error) {
      this.onError(error);
    }
  }

  /** Show (or hide, when open) a person's page. */
  async toggle(name) {
    this.state.faces.open = this.state.faces.open === name ? null : name;
    await this.load();
  }

  async removePhoto(name, photoId) {
    try {
      await this.api.request(`/api/faces/${encodeURIComponent(name)}/photos/${encodeURIComponent(photoId)}`,
        { method: "DELETE" });
      this.say(`One photo of ${name} removed.`);
    } catch (error) {
      if (error.unauthorized) { this.onError(error); return; }
      this.say(`Not removed: ${error.message}`); // the last photo: delete the person instead
    }
    await this.load();
  }

  /** A URL an <img> can load (it cannot send headers: the token goes in the query). */
  mediaUrl(path) {
    const url = new URL(path, location.href);
    if (this.api.token) url.searchParams.set("token", this.api.token);
    return url.toString();
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
    const { people, open, page } = this.state.faces;
    // The names "this is …" on the timeline offers.
    this.known.replaceChildren(...people.map((person) => Object.assign(document.createElement("option"),
      { value: person.name })));
    this.list.replaceChildren(...people.map((person) => {
      const item = document.createElement("li");
      item.dataset.name = person.name;
      item.append(`${person.name} (${person.faces}) `);
      const photos = button(open === person.name ? "hide photos" : "photos", "photos",
        () => this.toggle(person.name));
      photos.setAttribute("aria-expanded", String(open === person.name));
      item.append(photos, " ", button("delete", "delete", () => this.remove(person.name)));
      if (open === person.name && page && page.name === person.name) item.append(this.page(page));
      return item;
    }));
  }

  page(page) {
    const box = document.createElement("div");
    box.className = "person-page";
    const note = document.createElement("p");
    note.className = "muted";
    note.textContent = `${page.faces} photo(s)`
      + (page.negatives ? `; ${page.negatives} face(s) marked not ${page.name}` : "");
    const photos = document.createElement("ul");
    photos.className = "person-photos";
    photos.replaceChildren(...page.photos.map((photo) => {
      const item = document.createElement("li");
      item.dataset.photoId = photo.id;
      const img = document.createElement("img");
      img.alt = `${page.name}, photo ${photo.id}`;
      img.src = this.mediaUrl(photo.url);
      item.append(img, button("remove", "remove", () => this.removePhoto(page.name, photo.id)));
      return item;
    }));
    box.append(note, photos);
    return box;
  }
}

function button(text, className, onClick) {
  const element = document.createElement("button");
  element.type = "button";
  element.className = className;
  element.textContent = text;
  element.addEventListener("click", onClick);
  return element;
}
