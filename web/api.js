// REST calls to the Vigil server, with the access token and errors a person can read.

const TOKEN_KEY = "vigil-token";

export class ApiError extends Error {
  /** status 0 means the server could not be reached at all. */
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }

  get unauthorized() { return this.status === 401; }
}

export class Api {
  constructor() {
    this.token = sessionStorage.getItem(TOKEN_KEY) || "";
  }

  setToken(token) {
    this.token = token;
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  }

  async request(path, { method = "GET", body } = {}) {
    const headers = {};
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let response;
    try {
      response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    } catch (error) {
      throw new ApiError(0, "unreachable",
        `Cannot reach the Vigil server at ${location.origin}: is it running? (${error.message})`);
    }
    if (response.status === 204) return null;
    let data = null;
    try { data = await response.json(); } catch { /* not JSON: reported below by status */ }
    if (!response.ok) {
      const detail = data && data.error ? data.error : {};
      throw new ApiError(response.status, detail.code || `http_${response.status}`,
        detail.message || `${response.status} ${response.statusText}`);
    }
    return data;
  }

  /** A ws:// URL for ``path``; browsers cannot set headers on WebSockets, so the token goes in the query. */
  webSocketUrl(path) {
    const url = new URL(path, location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    if (this.token) url.searchParams.set("token", this.token);
    return url.toString();
  }
}
