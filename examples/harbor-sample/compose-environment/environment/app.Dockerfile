FROM python:3.11-slim-bookworm
WORKDIR /app
COPY numbers.txt /app/numbers.txt
