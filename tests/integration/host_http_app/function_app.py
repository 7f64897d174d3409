"""A tiny app with HTTP triggers, for the local host's HTTP server tests."""

import asyncio
import json
import threading

import azure.functions as func

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)


@app.route(route="items/{item_id}", methods=["GET"])
def get_item(req: func.HttpRequest) -> func.HttpResponse:
    body = {"item": req.route_params["item_id"], "verbose": req.params.get("verbose")}
    return func.HttpResponse(json.dumps(body), mimetype="application/json")


@app.route(route="threads/sync", methods=["GET"])
def sync_thread(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(threading.current_thread().name)


@app.route(route="threads/async", methods=["GET"])
async def async_thread(req: func.HttpRequest) -> func.HttpResponse:
    await asyncio.sleep(0)
    return func.HttpResponse(threading.current_thread().name)


@app.route(route="items/{item_id}/notes", methods=["POST"])
def add_note(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(req.get_body(), status_code=201, headers={"X-Item": "yes"})


@app.route(route="boom", methods=["GET"])
def boom(req: func.HttpRequest) -> func.HttpResponse:
    raise RuntimeError("the function failed")


@app.route(route="boom-async", methods=["GET"])
async def boom_async(req: func.HttpRequest) -> func.HttpResponse:
    raise RuntimeError("the coroutine failed")
