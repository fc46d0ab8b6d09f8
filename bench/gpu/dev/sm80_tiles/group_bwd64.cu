#include "variants.cuh"
void add_bwd64(std::vector<Variant>& v) {
  BWD("128x128 4,4,4 (adopted)", 64, 0, 128, 128, 8, 4, 4, 4, 2);
  BWD("128x128 4,4,4 (adopted)", 64, 1, 128, 128, 8, 4, 4, 4, 2);
}
