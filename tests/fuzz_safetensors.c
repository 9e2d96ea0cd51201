// libFuzzer target: any bytes as a .safetensors file, through the header parser and, when the
// header holds, the GPT-2 conversion (configuration from the shapes, as without config.json);
// the same bytes also as a config.json. Nothing may crash, leak or read outside the input.
//   make fuzz && build/fuzz/fuzz_safetensors -max_total_time=60 CORPUS_DIR
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Error err;
    SafetensorsIndex index;
    if (safetensors_parse_header(data, size, "fuzz", &index, &err) == 0) {
        GPT2Model model;
        memset(&model, 0, sizeof(model));
        if (safetensors_gpt2_from_index(&model, &index, NULL, "fuzz", &err) == 0) gpt2_model_free(&model);
        safetensors_index_free(&index);
    }
    GPT2Config config;
    safetensors_read_config((const char *)data, size, "fuzz", &config, &err);
    return 0;
}
