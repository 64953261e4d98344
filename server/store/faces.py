"""``/api/faces``: the people ``video.faces`` recognises. Enrol one from photos of their face (multipart, any
number of image parts, or one raw JPEG/PNG body), list them, delete one (every embedding and image of theirs goes).
The photos and embeddings are kept under ``storage.data_dir``/faces (``pipelines.video.faces.FaceGallery``) and
never appear in logs or metrics."""

from __future__ import annotations

import asyncio

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import BaseModel, Field

from pipelines.errors import ApiError
from pipelines.video.faces import FaceRecognizer, check_name
from server.http.errors import read_body
from server.http.route import Route
from server.state import ENGINES

MAX_UPLOAD_BYTES = 20 * 1024 * 1024  # all the photos of one request together
MAX_IMAGES = 20


class PersonInfo(BaseModel):
    name: str
    faces: int = Field(description="Enrolled face embeddings (one per photo).")


class PeopleList(BaseModel):
    people: list[PersonInfo]


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


async def enrol(request: web.Request) -> web.Response:
    name = check_name(request.match_info["name"])
    images = await _images(request)
    recognizer = await _recognizer(request)
    person = await asyncio.to_thread(recognizer.enrol, name, images)
    return web.json_response(text=PersonInfo(**person.info()).model_dump_json(), status=201)


async def list_people(request: web.Request) -> web.Response:
    gallery = await asyncio.to_thread(request.app[ENGINES].face_gallery)  # no model needed: the dashboard asks
    people = [PersonInfo(**p.info()) for p in gallery.people()]
    return web.json_response(text=PeopleList(people=people).model_dump_json())


async def delete_person(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    gallery = await asyncio.to_thread(request.app[ENGINES].face_gallery)
    if not await asyncio.to_thread(gallery.delete, name):
        raise ApiError("not_found", "nobody is enrolled under that name")
    return web.Response(status=204)


_ONE = "/api/faces/{name}"
FACE_ROUTES: tuple[Route, ...] = (
    Route("GET", "/api/faces", list_people, "The people enrolled for face recognition (video.faces)",
          response=PeopleList, errors=(401,)),
    Route("POST", _ONE, enrol, "Enrol a person (or add photos): a raw image/jpeg or image/png body, or "
          "multipart/form-data with one photo per part; each photo must show exactly one face",
          response=PersonInfo, status=201, errors=(400, 401, 413, 415), form_fields=("image",)),
    Route("DELETE", _ONE, delete_person, "Delete a person: every embedding and photo of theirs", status=204,
          errors=(401, 404)),
)
