// C reference for the block hash benchmark: xxh3-64 with a seed over 16-token
// blocks of u32 ids, as an engine in C would call it. Built and run by
// BenchmarkHashBlock (needs gcc and libxxhash-dev); prints ns per block.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

int main(int argc, char **argv) {
	long iters = argc > 1 ? atol(argv[1]) : 20000000;
	uint32_t tokens[16];
	for (int i = 0; i < 16; i++) tokens[i] = (uint32_t)(i * 7919);
	uint64_t acc = 0;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < iters; i++) {
		tokens[i & 15] = (uint32_t)i; // new content each block, as in the Go loop
		acc += XXH3_64bits_withSeed(tokens, sizeof tokens, 1337); // same work as the Go loop
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
	printf("%.3f %llu\n", ns / iters, (unsigned long long)acc);
	return 0;
}
