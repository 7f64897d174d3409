import threading
from contextlib import asynccontextmanager

import azure.functions as func
from fastapi import FastAPI, Request
from starlette.applications import Starlette
from starlette.routing import Mount

api = FastAPI()
lifespan_events: list[str] = []


@asynccontextmanager
async def lifespan(_app):
    lifespan_events.append("startup")
    yield
    lifespan_events.append("shutdown")


@api.get("/items/{item_id}")
async def get_item(item_id: str, request: Request, verbose: str | None = None) -> dict:
    return {
        "item": item_id,
        "verbose": verbose,
        "path": request.url.path,
        "caller": request.headers.get("x-ms-client-principal-name"),
        "thread": threading.current_thread().name,
    }


@api.post("/items/{item_id}/notes", status_code=201)
async def add_note(item_id: str, request: Request) -> dict:
    return {"item": item_id, "note": (await request.body()).decode()}


app = func.AsgiFunctionApp(
    app=Starlette(routes=[Mount("/api", app=api)], lifespan=lifespan),
    http_auth_level=func.AuthLevel.FUNCTION,
)
