#!/bin/bash
sed -i 's/for row in rows\[1:\]:/for row in rows:/' /app/report.py
