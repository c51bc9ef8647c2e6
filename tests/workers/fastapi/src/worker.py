"""A FastAPI app served through the workers SDK's ASGI adapter (test fixture)."""

import asgi
from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel
from workers import WorkerEntrypoint

app = FastAPI()


class Item(BaseModel):
    name: str
    quantity: int = 1


@app.get("/")
async def index():
    return {"message": "FastAPI on a Python Worker"}


@app.get("/square/{number}")
async def square(number: int):
    return {"number": number, "square": number * number}


@app.post("/items")
async def create_item(item: Item):
    if item.quantity < 1:
        raise HTTPException(status_code=422, detail="quantity must be positive")
    return {"created": item.name, "quantity": item.quantity}


@app.get("/motto")
async def motto(request: Request):
    return {"motto": request.scope["env"].MOTTO}


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        return await asgi.fetch(app, request.js_object, self.env)
