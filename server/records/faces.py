"""``/api/faces``: the people ``video.faces`` recognises. Enrol one from photos of their face (multipart, any
number of image parts, or one raw JPEG/PNG body), list them, delete one: every embedding and photo of theirs goes,
and their name goes from everything Vigil wrote (the timeline's events, alerts, replies and transcripts, and the
memory index: ``pipelines.timeline.forget``); the answer says what changed. Their events' clips and snapshots are
kept, unnamed (docs/faces.md says why). The photos (stored without their metadata) and embeddings are kept under
``storage.data_dir``/faces (``pipelines.video.faces.FaceGallery``) and never appear in logs or metrics."""

from __future__ import annotations

import asyncio
from urllib.parse import quote

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import BaseModel, ConfigDict, Field

from pipelines.errors import ApiError
from pipelines.memory.feed import memory_entry
from pipelines.timeline.store import Forgotten, StorageUnavailable, TimelineEntry, TimelineStore
from pipelines.video.faces import NAME, FaceGallery, FaceRecognizer, Person, check_name
from server.engines import ENGINES
from server.http.errors import read_body, read_json_body
from server.http.route import Route
from server.state import MEMORY, TIMELINE

MAX_UPLOAD_BYTES = 20 * 1024 * 1024  # all the photos of one request together
MAX_IMAGES = 20


class PersonInfo(BaseModel):
    name: str
    faces: int = Field(description="Enrolled face embeddings (one per photo).")


class PeopleList(BaseModel):
    people: list[PersonInfo]


class ForgottenEntries(BaseModel):
    entries: int = Field(description="Timeline entries changed (each is kept, without the name).")
    identities: int = Field(description=(
        "Events and alerts whose identity (the name and its score) was removed: they read as a person nobody "
        "enrolled, and ?identity= no longer finds them."))
    texts: int = Field(description=(
        "Alerts, replies and transcripts whose text named the person: the name (a whole word, its case) now reads "
        "'someone', as an alert says for a stranger."))
    clips_kept: int = Field(description="Clips of those events, kept and still served (docs/faces.md says why).")
    snapshots_kept: int = Field(description="Snapshots of those events, kept and still served (no name is drawn).")


class PersonDeleted(BaseModel):
    name: str
    faces: int = Field(description=(
        "Face embeddings deleted, with their photos (0: the person was no longer enrolled, and this deletion "
        "finished the forgetting an interrupted one started)."))
    timeline: ForgottenEntries | None = Field(description="What changed in the timeline (null: storage is off).")
    memory_entries: int | None = Field(description=(
        "Memory entries replaced by their version without the name (keyword index at once, re-embedded in the "
        "background; the old vectors are deleted). Null: memory is off."))


async def _recognizer(request: web.Request) -> FaceRecognizer:
    # The model loads on first use (about a second): on a thread, never the event loop.
    return await asyncio.to_thread(request.app[ENGINES].faces)


async def _images(request: web.Request) -> list[bytes]:
    if not request.content_type.startswith("multipart/"):
        if request.content_type not in ("image/jpeg", "image/png", "application/octet-stream"):
            raise ApiError("unsupported_media_type", "send image/jpeg, image/png or multipart/form-data with one "
                           "image per part")
        return [await read_body(request, MAX_UPLOAD_BYTES, code="file_too_large", what="image")]
    images: list[bytes] = []
    size = 0
    try:
        reader = await request.multipart()
        async for part in reader:
            if not isinstance(part, BodyPartReader):
                raise ApiError("invalid_request", "nested multipart bodies are not accepted")
            data = bytearray()
            while chunk := await part.read_chunk(1 << 16):
                size += len(chunk)
                if size > MAX_UPLOAD_BYTES:
                    raise ApiError("file_too_large", f"the images add up to more than {MAX_UPLOAD_BYTES} bytes")
                data += chunk
            images.append(bytes(data))
            if len(images) > MAX_IMAGES:
                raise ApiError("invalid_request", f"at most {MAX_IMAGES} images per request")
    except HttpProcessingError:
        raise ApiError("invalid_request", "malformed multipart/form-data body") from None
    except (ValueError, AssertionError, web.HTTPException) as error:
        raise ApiError("invalid_request", f"malformed multipart/form-data body: {error}") from None
    return images


class EnrolFromEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")
    event_id: str = Field(min_length=1, max_length=64, description=(
        "A stored event of a tracked person (GET /api/events): their face is taken from the event's snapshot, "
        "inside the track's box."))


async def _event(request: web.Request, event_id: str) -> tuple[TimelineStore, TimelineEntry]:
    timeline = request.app.get(TIMELINE)
    if timeline is None:
        raise ApiError("not_found", "the timeline is off (storage.enabled: false): no stored event")
    if not timeline.available:
        raise ApiError("storage_unavailable", timeline.open_error or "timeline storage unavailable")
    entry = await asyncio.to_thread(timeline.get, event_id)
    if entry is None or entry.kind != "event":
        raise ApiError("not_found", "no such event", param="event_id")
    return timeline, entry


async def _event_snapshot(request: web.Request, event_id: str) -> tuple[bytes, list[float]]:
    """The snapshot of a stored event and where its track was on it."""
    timeline, entry = await _event(request, event_id)
    box = entry.data.get("box")
    if not isinstance(box, list) or len(box) != 4:
        raise ApiError("no_track", "the event has no tracked object's box to take a face from (an event recorded "
                       "before boxes were kept, or not about an object)", param="event_id")
    path = timeline.media_path(entry.snapshot)
    if path is None:
        raise ApiError("no_snapshot", "the event has no snapshot (storage.clips off, or deleted by retention)",
                       param="event_id")
    return await asyncio.to_thread(path.read_bytes), [float(v) for v in box]


async def enrol(request: web.Request) -> web.Response:
    name = check_name(request.match_info["name"])
    if request.content_type == "application/json":  # from what a camera saw
        event = await read_json_body(request, EnrolFromEvent)
        snapshot, box = await _event_snapshot(request, event.event_id)
        recognizer = await _recognizer(request)
        person = await asyncio.to_thread(recognizer.enrol_from_snapshot, name, snapshot, box)
    else:
        images = await _images(request)
        recognizer = await _recognizer(request)
        person = await asyncio.to_thread(recognizer.enrol, name, images)
    timeline = request.app.get(TIMELINE)
    if timeline is not None:
        timeline.allow_identity(name)  # enrolled again: their events are named again from now on
    return web.json_response(text=PersonInfo(**person.info()).model_dump_json(), status=201)


class PhotoInfo(BaseModel):
    id: str
    url: str = Field(description="The stored photo (its pixels only, re-encoded without metadata).")


class PersonPage(PersonInfo):
    photos: list[PhotoInfo] = Field(description="The photos behind the name, one embedding each.")
    negatives: int = Field(description=(
        "Faces marked 'not this person' (POST /api/events/{event_id}/not-this-person): a face nearer one of them "
        "than to these photos is not given the name."))


class NotThisPerson(BaseModel):
    event_id: str
    name: str = Field(description="The name the event no longer carries.")
    negatives: int = Field(description="Faces now kept as not this person.")


def _page(person: Person) -> PersonPage:
    photos = [PhotoInfo(id=file.split(".")[0], url=f"/api/faces/{quote(person.name)}/photos/{file.split('.')[0]}")
              for file in person.images]
    return PersonPage(**person.info(), photos=photos, negatives=person.negative_count())


async def _person(request: web.Request) -> tuple[FaceGallery, Person]:
    name = request.match_info["name"]
    gallery = await asyncio.to_thread(request.app[ENGINES].face_gallery)
    person = gallery.person(name) if NAME.match(name) else None
    if person is None:
        raise ApiError("not_found", "nobody is enrolled under that name")
    return gallery, person


async def get_person(request: web.Request) -> web.Response:
    _, person = await _person(request)
    return web.json_response(text=_page(person).model_dump_json())


async def get_photo(request: web.Request) -> web.FileResponse:
    gallery, person = await _person(request)
    path = gallery.photo_path(person.name, request.match_info["photo_id"])
    if path is None or not path.is_file():
        raise ApiError("not_found", "no such photo")
    content_type = "image/png" if path.suffix == ".png" else "image/jpeg"
    return web.FileResponse(path, headers={"Content-Type": content_type, "Cache-Control": "no-store"})


async def delete_photo(request: web.Request) -> web.Response:
    gallery, person = await _person(request)
    kept = await asyncio.to_thread(gallery.remove_photo, person.name, request.match_info["photo_id"])
    if kept is None:
        raise ApiError("not_found", "no such photo")
    return web.json_response(text=_page(kept).model_dump_json())


async def not_this_person(request: web.Request) -> web.Response:
    """The event named the wrong person: its face is kept as a negative for that name (a face nearer it than to
    the person's photos is not named) and the name goes from the event (its text says "someone")."""
    event_id = request.match_info["event_id"]
    timeline, entry = await _event(request, event_id)
    name = (entry.data.get("identity") or {}).get("name")
    if not name:
        raise ApiError("not_recognised", "the event names nobody", param="event_id")
    snapshot, box = await _event_snapshot(request, event_id)
    recognizer = await _recognizer(request)
    person = await asyncio.to_thread(recognizer.not_this_person, name, snapshot, box)
    changed = await asyncio.to_thread(timeline.unname, event_id, name)
    memory = request.app.get(MEMORY)
    if memory is not None and changed is not None:
        await asyncio.to_thread(memory.rewrite_events, [memory_entry(changed)])
    answer = NotThisPerson(event_id=event_id, name=name, negatives=person.negative_count())
    return web.json_response(text=answer.model_dump_json())


async def list_people(request: web.Request) -> web.Response:
    gallery = await asyncio.to_thread(request.app[ENGINES].face_gallery)  # no model needed: the dashboard asks
    people = [PersonInfo(**p.info()) for p in gallery.people()]
    return web.json_response(text=PeopleList(people=people).model_dump_json())


async def delete_person(request: web.Request) -> web.Response:
    """The person's embeddings and photos go first (no track is named after them from the next frame on), then
    their name from the timeline and from memory. A retry finishes what an interrupted deletion left (the timeline
    still names them): 404 only when nothing anywhere has the name."""
    name = request.match_info["name"]
    if not NAME.match(name):
        raise ApiError("not_found", "nobody is enrolled under that name")
    gallery = await asyncio.to_thread(request.app[ENGINES].face_gallery)
    person = await asyncio.to_thread(gallery.delete, name)
    timeline, memory = request.app.get(TIMELINE), request.app.get(MEMORY)
    forgotten: Forgotten | None = None
    if timeline is not None:
        try:
            forgotten = await asyncio.to_thread(timeline.forget_identity, name, enrolled=person is not None)
        except StorageUnavailable as error:  # a retry, once the storage is back, finishes the forgetting
            done = "their photos and embeddings are deleted, but " if person is not None else ""
            raise ApiError("storage_unavailable", f"{done}their name could not be taken out of the timeline "
                           f"({error}); retry the deletion") from None
    if person is None and (forgotten is None or not forgotten.entries):
        raise ApiError("not_found", "nobody is enrolled under that name")
    rewritten = None
    if memory is not None:
        entries = [memory_entry(e) for e in forgotten.entries] if forgotten is not None else []
        rewritten = await asyncio.to_thread(memory.rewrite_events, entries)
    answer = PersonDeleted(
        name=name, faces=len(person.embeddings) if person is not None else 0, memory_entries=rewritten,
        timeline=None if forgotten is None else ForgottenEntries(
            entries=len(forgotten.entries), identities=forgotten.identities, texts=forgotten.texts,
            clips_kept=forgotten.clips, snapshots_kept=forgotten.snapshots))
    return web.json_response(text=answer.model_dump_json())


_ONE = "/api/faces/{name}"
FACE_ROUTES: tuple[Route, ...] = (
    Route("GET", "/api/faces", list_people, "The people enrolled for face recognition (video.faces)",
          response=PeopleList, errors=(401,)),
    Route("POST", _ONE, enrol, "Enrol a person (or add photos): a raw image/jpeg or image/png body, or "
          "multipart/form-data with one photo per part (each must show exactly one face), or application/json "
          "{\"event_id\"}: the face of the event's tracked person on its snapshot",
          body=EnrolFromEvent, response=PersonInfo, status=201, errors=(400, 401, 404, 413, 415, 422),
          form_fields=("image",)),
    Route("GET", _ONE, get_person, "A person's page: the photos behind the name and how many faces were marked "
          "'not this person'", response=PersonPage, errors=(401, 404)),
    Route("GET", _ONE + "/photos/{photo_id}", get_photo, "One of a person's photos", content_type="image/jpeg",
          errors=(401, 404)),
    Route("DELETE", _ONE + "/photos/{photo_id}", delete_photo, "Remove one photo of a person and its embedding "
          "(the last one: 409, delete the person instead)", response=PersonPage, errors=(401, 404, 409)),
    Route("POST", "/api/events/{event_id}/not-this-person", not_this_person, "The event's face is not the person "
          "it was named: kept as a negative for that name (a face nearer it than to their photos is not named), "
          "and the name is taken off the event", response=NotThisPerson, errors=(400, 401, 404, 503)),
    Route("DELETE", _ONE, delete_person, "Delete a person: every embedding and photo of theirs, and their name "
          "from the timeline (events, alerts, replies, transcripts) and memory; their events' clips and snapshots "
          "are kept, unnamed. The answer counts what changed", response=PersonDeleted, errors=(401, 404, 503)),
)
