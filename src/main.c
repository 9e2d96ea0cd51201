// ./gpt2: GPT-2 inference. `./gpt2 -p "prompt"` generates; the other verbs are tools around it.
#include <string.h>

#include "commands.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
} Command;

static const Command commands[] = {
    {"validate", cmd_validate},
    {"tokenize", cmd_tokenize},
    {"detokenize", cmd_detokenize},
    {"compare", cmd_compare},
    {"bench", cmd_bench},
};

int main(int argc, char **argv) {
    if (argc > 1) {
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
            if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    }
    return cmd_generate(argc, argv);
}
