# gpt2.c
#   make                 ./gpt2: host C (gcc, OpenMP) + CUDA kernels (nvcc, cuBLAS) when nvcc is found
#   make GPU=0           CPU-only ./gpt2, no CUDA toolkit needed
#   make test            builds and runs every test; ends with "N passed, N failed, N skipped"
#   make test SANITIZE=1 the CPU build and tests under AddressSanitizer + UBSan (build/san/)
#   make fuzz            libFuzzer targets (clang) in build/fuzz/
#   make download        GPT-2 weights from the Hugging Face hub into model/ (MODEL=gpt2|gpt2-medium|...)
#   CUDA_ARCH=...        override the fat-binary targets, e.g. "-gencode arch=compute_90a,code=sm_90a"
#   make TRACE=1         build/gpu-trace/gpt2: kernels stamp a timeline (kernels/kernel_trace.cuh)
#   make ktrace          build/libktrace.so: any run's kernels, memsets and copies through CUPTI (scripts/ktrace.c)

CC        := gcc
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard $(CUDA_HOME)/bin/nvcc))
SANITIZE  ?= 0
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)

ifeq ($(SANITIZE),1)
  GPU    := 0
  BUILD  := build/san
  BIN    := build/san/gpt2
  OPT    := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else ifeq ($(TRACE),1)
  GPU    := 1
  BUILD  := build/gpu-trace
  BIN    := build/gpu-trace/gpt2
  OPT    := -O3 -march=x86-64-v2
  EXTRA_NVCCFLAGS += -DGPT2_TRACE
else
  GPU    ?= $(if $(NVCC),1,0)
  BUILD  := build/$(if $(filter 1,$(GPU)),gpu,cpu)
  BIN    := gpt2
  OPT    := -O3 -march=x86-64-v2
endif

# Ampere (sm_80, sm_86), Ada (sm_89), Hopper with its own instructions (sm_90a), and PTX for what comes later.
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_86,code=sm_86 \
             -gencode arch=compute_89,code=sm_89 -gencode arch=compute_90a,code=sm_90a \
             -gencode arch=compute_90,code=compute_90

CFLAGS   := $(OPT) -std=c11 -D_GNU_SOURCE -Wall -Wextra -fopenmp -Isrc -Ikernels -Itokenizer $(EXTRA_CFLAGS)
LDLIBS   := -lcjson -lpcre2-8 -lm
LDFLAGS  := $(OPT) -fopenmp $(EXTRA_LDFLAGS)

HOST_SRC   := $(filter-out src/main.c,$(wildcard src/*.c)) $(wildcard tokenizer/*.c)
KERNEL_SRC := $(wildcard kernels/*.cu)
HEADERS    := $(wildcard src/*.h kernels/*.h kernels/*.cuh tokenizer/*.h)
HOST_OBJ   := $(patsubst %.c,$(BUILD)/%.o,$(HOST_SRC))

ifeq ($(GPU),1)
  CFLAGS     += -DGPT2_CUDA=1 -I$(CUDA_HOME)/include
  NVCCFLAGS  := -O3 -std=c++17 -lineinfo $(CUDA_ARCH) -Isrc -Ikernels -DGPT2_CUDA=1 \
                -DGPT2_SM90A=$(if $(findstring compute_90a,$(CUDA_ARCH)),1,0) \
                -Xcompiler -Wall,-Wextra --expt-relaxed-constexpr -Wno-deprecated-gpu-targets $(EXTRA_NVCCFLAGS)
  KERNEL_OBJ := $(patsubst %.cu,$(BUILD)/%.o,$(KERNEL_SRC))
  LDLIBS     += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart_static \
                -ldl -lrt -lpthread -lstdc++
endif

LIB_OBJ    := $(HOST_OBJ) $(KERNEL_OBJ)
TEST_BINS  := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c))

.PHONY: all test fuzz download clean ktrace
all: $(BIN)

$(BIN): $(BUILD)/src/main.o $(LIB_OBJ)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu $(HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/tests/%: tests/%.c tests/test.h $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(LIB_OBJ) $(LDFLAGS) $(LDLIBS)

test: $(BIN) $(TEST_BINS)
	@GPT2_BIN=$(abspath $(BIN)) GPT2_BUILD=$(BUILD) GPT2_SANITIZE=$(SANITIZE) bash tests/run.sh

# libFuzzer targets: the parsers that read untrusted bytes, built with clang.
FUZZ_SRC  := $(HOST_SRC)
FUZZ_BINS := $(patsubst tests/%.c,build/fuzz/%,$(wildcard tests/fuzz_*.c))
fuzz: $(FUZZ_BINS)
build/fuzz/%: tests/%.c $(FUZZ_SRC) $(HEADERS)
	@mkdir -p $(dir $@)
	clang -O1 -g -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -Isrc -Ikernels -Itokenizer \
	    -o $@ $< $(FUZZ_SRC) -lcjson -lpcre2-8 -lm

# CUPTI ships with the toolkit; where it sits depends on how the toolkit was installed.
CUPTI_DIRS := $(CUDA_HOME)/extras/CUPTI $(CUDA_HOME)
ktrace: build/libktrace.so
build/libktrace.so: scripts/ktrace.c
	@mkdir -p build
	$(CC) -O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra -shared -fPIC $(CUPTI_DIRS:%=-I%/include) -o $@ $< \
	    $(foreach d,$(CUPTI_DIRS),-L$(d)/lib64 -L$(d)/lib -Wl,-rpath,$(d)/lib64 -Wl,-rpath,$(d)/lib) -lcupti

# MODEL from the command line only: an environment's MODEL (common in ML setups) is not a GPT-2 size.
download:
	bash scripts/download_model.sh $(if $(filter command line,$(origin MODEL)),$(MODEL),gpt2)

clean:
	rm -rf build gpt2
