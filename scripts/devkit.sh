#!/usr/bin/env bash
# Stages what a GPU machine without Debian's -dev packages needs to build and run gpt2.c there:
# the cJSON, PCRE2 and stb headers and the cJSON/PCRE2 shared libraries, in .devkit/ (git-ignored).
# Then, on that machine:
#   make -j16 EXTRA_CFLAGS=-I.devkit/include EXTRA_LDFLAGS=-L.devkit/lib
#   export LD_LIBRARY_PATH=$PWD/.devkit/lib
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .devkit && mkdir -p .devkit/include .devkit/lib
cp -r /usr/include/cjson /usr/include/stb /usr/include/pcre2.h .devkit/include/
lib=/usr/lib/x86_64-linux-gnu
cp -L "$lib/libcjson.so.1" .devkit/lib/libcjson.so.1
ln -s libcjson.so.1 .devkit/lib/libcjson.so
cp -L "$lib/libpcre2-8.so.0" .devkit/lib/libpcre2-8.so.0
ln -s libpcre2-8.so.0 .devkit/lib/libpcre2-8.so
cp -L "$lib/libcjson.so.1" .devkit/libcjson.so.1   # for LD_LIBRARY_PATH=.devkit (runtime only)
du -sh .devkit
