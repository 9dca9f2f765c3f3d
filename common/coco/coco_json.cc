#include "common/coco/coco_json.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <set>

#include <simdjson.h>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "common/security/data_roots.h"
#include "common/security/sha256.h"
#include "metrics/parallel_for.h"
#include "base/text.h"

namespace tally {
namespace {

namespace sj = simdjson::ondemand;
using simdjson::error_code;

absl::Status FileError(absl::string_view name, absl::string_view where, error_code e) {
  return absl::InvalidArgumentError(
      absl::StrCat("COCO file '", name, "': ", where, ": ", simdjson::error_message(e)));
}

absl::Status FieldError(absl::string_view name, absl::string_view where, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("COCO file '", name, "': ", where, ": ", why));
}

// A name that reaches reports and file paths: no NUL or other control character (as manifest
// fields). simdjson has already checked that the document is UTF-8.
error_code GetName(sj::value v, std::string* out, std::string* why, absl::string_view field) {
  std::string_view s;
  if (error_code e = v.get_string().get(s); e) return e;
  const int64_t at = FirstControlCharacter(absl::string_view(s.data(), s.size()), false);
  if (at >= 0) {
    *why = absl::StrCat("'", field, "' holds a control character (byte ", at, ")");
    return simdjson::INCORRECT_TYPE;
  }
  *out = std::string(s);
  return simdjson::SUCCESS;
}

// A value of the wrong type or range: the annotation is wrong, the file can still be read.
bool ValueError(error_code e) {
  return e == simdjson::INCORRECT_TYPE || e == simdjson::NUMBER_ERROR || e == simdjson::NUMBER_OUT_OF_RANGE;
}

// An integer field; integral doubles (12.0) are accepted.
error_code GetInt(sj::value v, int64_t* out) {
  sj::number n;
  if (error_code e = v.get_number().get(n); e) return e;
  if (n.is_int64()) {
    *out = n.get_int64();
    return simdjson::SUCCESS;
  }
  if (n.is_uint64()) return simdjson::NUMBER_OUT_OF_RANGE;
  const double d = n.get_double();
  if (!(std::fabs(d) < 9e15) || std::floor(d) != d) return simdjson::INCORRECT_TYPE;
  *out = static_cast<int64_t>(d);
  return simdjson::SUCCESS;
}

error_code GetFlag(sj::value v, bool* out) {
  bool b = false;
  if (v.get_bool().get(b) == simdjson::SUCCESS) {
    *out = b;
    return simdjson::SUCCESS;
  }
  int64_t i = 0;
  if (error_code e = GetInt(v, &i); e) return e;
  *out = i != 0;
  return simdjson::SUCCESS;
}

error_code GetNumbers(sj::value v, std::vector<double>* out) {
  sj::array a;
  if (error_code e = v.get_array().get(a); e) return e;
  for (auto element : a) {
    double d = 0;
    if (error_code e = element.get_double().get(d); e) return e;
    out->push_back(d);
  }
  return simdjson::SUCCESS;
}

// Calls `field(key, value)` for every field of `o`, in order; the first error ends the walk.
template <typename Field>
error_code ForEachField(sj::object o, Field field) {
  for (auto f : o) {
    std::string_view key;
    if (error_code e = f.unescaped_key().get(key); e) return e;
    sj::value v;
    if (error_code e = f.value().get(v); e) return e;
    if (error_code e = field(key, v); e) return e;
  }
  return simdjson::SUCCESS;
}

// {"counts": [...] | "...", "size": [h, w]}
error_code ParseRle(sj::object o, CocoSegmentation* s, std::string* why) {
  error_code walked = ForEachField(o, [&](std::string_view key, sj::value v) -> error_code {
    if (key == "counts") {
      sj::json_type t;
      if (error_code e = v.type().get(t); e) return e;
      if (t == sj::json_type::string) {
        std::string_view str;
        if (error_code e = v.get_string().get(str); e) return e;
        s->kind = CocoSegmentation::Kind::kString;
        s->counts_string = std::string(str);
      } else {
        std::vector<double> runs;
        if (error_code e = GetNumbers(v, &runs); e) {
          *why = "segmentation 'counts' is neither a string nor a list of numbers";
          return e;
        }
        s->kind = CocoSegmentation::Kind::kCounts;
        for (double r : runs) {
          if (std::floor(r) != r || !(std::fabs(r) < 9e15)) {
            *why = absl::StrCat("segmentation 'counts' holds ", r, ", not a whole number");
            return simdjson::INCORRECT_TYPE;
          }
          s->counts.push_back(static_cast<int64_t>(r));
        }
      }
    } else if (key == "size") {
      std::vector<double> size;
      if (error_code e = GetNumbers(v, &size); e || size.size() != 2 || !(size[0] >= 0) || !(size[1] >= 0) ||
                                                 size[0] > 1e9 || size[1] > 1e9 || std::floor(size[0]) != size[0] ||
                                                 std::floor(size[1]) != size[1]) {
        *why = "segmentation 'size' is not [height, width] in whole numbers";
        return e ? e : simdjson::INCORRECT_TYPE;
      }
      s->height = static_cast<int64_t>(size[0]);
      s->width = static_cast<int64_t>(size[1]);
    }
    return simdjson::SUCCESS;
  });
  if (walked) return walked;
  if (s->kind == CocoSegmentation::Kind::kNone) {
    *why = "segmentation has no 'counts'";
    return simdjson::INCORRECT_TYPE;
  }
  if (s->height < 0) {
    *why = "segmentation has no 'size'";
    return simdjson::INCORRECT_TYPE;
  }
  return simdjson::SUCCESS;
}

error_code ParseSegmentation(sj::value v, CocoSegmentation* s, std::string* why) {
  sj::json_type t;
  if (error_code e = v.type().get(t); e) return e;
  if (t == sj::json_type::object) {
    sj::object o;
    if (error_code e = v.get_object().get(o); e) return e;
    return ParseRle(o, s, why);
  }
  if (t != sj::json_type::array) {
    *why = "segmentation is neither a list of polygons nor an RLE object";
    return simdjson::INCORRECT_TYPE;
  }
  sj::array polygons;
  if (error_code e = v.get_array().get(polygons); e) return e;
  s->kind = CocoSegmentation::Kind::kPolygons;
  for (auto p : polygons) {
    sj::value pv;
    if (error_code e = p.get(pv); e) return e;
    s->polygons.emplace_back();
    if (error_code e = GetNumbers(pv, &s->polygons.back()); e) {
      *why = absl::StrCat("polygon ", s->polygons.size() - 1, " is not a list of numbers");
      return e;
    }
  }
  if (s->polygons.empty()) {
    *why = "segmentation is an empty list of polygons";
    return simdjson::INCORRECT_TYPE;
  }
  return simdjson::SUCCESS;
}

// One annotation or result object. Structural errors are returned; an annotation's own problems
// go to its `error`.
error_code ParseAnnotation(sj::object o, bool result, CocoAnnotation* a, std::string* file_why) {
  bool has_id = false, has_image = false, has_category = false, has_score = false;
  std::string why;
  error_code walked = ForEachField(o, [&](std::string_view key, sj::value v) -> error_code {
    error_code e = simdjson::SUCCESS;
    std::string field_why;
    if (key == "id") {
      if (result) return simdjson::SUCCESS;  // pycocotools' loadRes numbers results by position.
      e = GetInt(v, &a->id);
      has_id = e == simdjson::SUCCESS;
    } else if (key == "image_id") {
      // Without its image an annotation cannot fail that image's row: the file is wrong (an image
      // scored without one of its annotations would be silently mis-scored).
      if (GetInt(v, &a->image_id) != simdjson::SUCCESS) {
        *file_why = "'image_id' is not an integer (an annotation must name its image)";
        return simdjson::INCORRECT_TYPE;
      }
      has_image = true;
    } else if (key == "category_id") {
      e = GetInt(v, &a->category_id);
      has_category = e == simdjson::SUCCESS;
      if (!has_category) field_why = "'category_id' is not an integer";
    } else if (key == "area") {
      e = v.get_double().get(a->area);
      a->has_area = e == simdjson::SUCCESS;
    } else if (key == "iscrowd") {
      e = GetFlag(v, &a->iscrowd);
    } else if (key == "score") {
      e = v.get_double().get(a->score);
      has_score = e == simdjson::SUCCESS && std::isfinite(a->score);
    } else if (key == "segmentation") {
      e = ParseSegmentation(v, &a->segmentation, &field_why);
    }
    if (e != simdjson::SUCCESS) {
      if (!ValueError(e)) return e;
      if (why.empty() && !field_why.empty()) why = field_why;
      if (why.empty()) {
        why = absl::StrCat("'", absl::string_view(key.data(), key.size()), "' has the wrong type or range");
      }
    }
    return simdjson::SUCCESS;
  });
  if (walked) return walked;
  if (!has_image) {
    *file_why = "no 'image_id' (an annotation must name its image)";
    return simdjson::INCORRECT_TYPE;
  }
  if (why.empty() && !has_category) why = "no 'category_id'";
  if (why.empty() && !result && !has_id) why = "no 'id'";
  if (why.empty() && result && !has_score) why = "no finite 'score'";
  if (why.empty() && a->segmentation.kind == CocoSegmentation::Kind::kNone) why = "no 'segmentation'";
  if (why.empty() && !result && a->id == 0) why = "id 0 (COCOeval reads a match with id 0 as no match)";
  if (!why.empty()) {
    a->error = result ? absl::StrCat("result ", a->id, " (image ", a->image_id, "): ", why)
                      : absl::StrCat("annotation ", a->id, " (image ", a->image_id, "): ", why);
  }
  return simdjson::SUCCESS;
}

// A scalar field kept as text (a group-by column): a string without control characters, a number
// as written, a boolean; at most kMaxCocoFieldBytes. Others are left out, never an error.
void KeepField(std::string_view key, sj::value v, std::vector<std::pair<std::string, std::string>>* fields) {
  sj::json_type t;
  if (v.type().get(t) != simdjson::SUCCESS || key.size() > kMaxCocoFieldBytes) return;
  std::string_view text;
  bool b = false;
  if (t == sj::json_type::string) {
    if (v.get_string().get(text) != simdjson::SUCCESS ||
        FirstControlCharacter(absl::string_view(text.data(), text.size()), false) >= 0) {
      return;
    }
  } else if (t == sj::json_type::number) {
    text = v.raw_json_token();
    while (!text.empty() && (text.back() == ' ' || text.back() == '\n' || text.back() == '\r' || text.back() == '\t')) {
      text.remove_suffix(1);
    }
  } else if (t == sj::json_type::boolean && v.get_bool().get(b) == simdjson::SUCCESS) {
    text = b ? "true" : "false";
  } else {
    return;
  }
  if (text.size() <= kMaxCocoFieldBytes) fields->emplace_back(std::string(key), std::string(text));
}

error_code ParseImage(sj::object o, CocoImageInfo* image, bool* has_id, std::string* why) {
  return ForEachField(o, [&](std::string_view key, sj::value v) -> error_code {
    if (key == "id") {
      *has_id = true;
      return GetInt(v, &image->id);
    }
    if (key == "file_name") return GetName(v, &image->file_name, why, "file_name");
    if (key == "height") return GetInt(v, &image->height);
    if (key == "width") return GetInt(v, &image->width);
    if (image->fields.size() < kMaxCocoImageFields) KeepField(key, v, &image->fields);
    return simdjson::SUCCESS;
  });
}

error_code ParseCategory(sj::object o, CocoCategoryInfo* c, bool* has_id, std::string* why) {
  return ForEachField(o, [&](std::string_view key, sj::value v) -> error_code {
    if (key == "id") {
      *has_id = true;
      return GetInt(v, &c->id);
    }
    if (key == "name") return GetName(v, &c->name, why, "name");
    if (key == "isthing") return GetFlag(v, &c->isthing);
    return simdjson::SUCCESS;
  });
}

// Calls `each(object, index)` for every element of the array `v`, which must be objects.
template <typename Each>
absl::Status ForEachObject(sj::value v, absl::string_view name, absl::string_view field, Each each) {
  sj::array a;
  if (error_code e = v.get_array().get(a); e) return FileError(name, absl::StrCat("'", field, "' is not a list"), e);
  size_t i = 0;
  for (auto element : a) {
    sj::object o;
    if (error_code e = element.get_object().get(o); e) {
      return FileError(name, absl::StrCat(field, "[", i, "] is not an object"), e);
    }
    if (absl::Status s = each(o, i); !s.ok()) return s;
    ++i;
  }
  return absl::OkStatus();
}

// A list of objects that must each have an integer id (`images`, `categories`).
template <typename T, typename Parse>
absl::Status ParseIdList(sj::value v, absl::string_view name, absl::string_view field, Parse parse,
                         std::vector<T>* out) {
  return ForEachObject(v, name, field, [&](sj::object o, size_t i) {
    T item;
    bool has_id = false;
    std::string why;
    const error_code e = parse(o, &item, &has_id, &why);
    if (!why.empty()) return FieldError(name, absl::StrCat(field, "[", i, "]"), why);
    if (e || !has_id) {
      return FileError(name, absl::StrCat(field, "[", i, "] has no integer 'id'"), e ? e : simdjson::INCORRECT_TYPE);
    }
    out->push_back(std::move(item));
    return absl::OkStatus();
  });
}

// One of `segments_info`: {"id", "category_id", "area", "iscrowd", ...}.
error_code ParsePanopticSegment(sj::object o, CocoPanopticSegment* s, std::string* why) {
  bool has_id = false, has_category = false;
  error_code walked = ForEachField(o, [&](std::string_view key, sj::value v) -> error_code {
    if (key == "id") {
      has_id = true;
      return GetInt(v, &s->id);
    }
    if (key == "category_id") {
      has_category = true;
      return GetInt(v, &s->category_id);
    }
    if (key == "area") return v.get_double().get(s->area);
    if (key == "iscrowd") return GetFlag(v, &s->iscrowd);
    return simdjson::SUCCESS;
  });
  if (walked) {
    if (ValueError(walked)) *why = "a field of the wrong type";
    return ValueError(walked) ? simdjson::SUCCESS : walked;
  }
  if (!has_id || s->id <= 0 || s->id >= (int64_t{1} << 24)) *why = "no segment id in 1..2^24-1";
  else if (!has_category) *why = "no category_id";
  return simdjson::SUCCESS;
}

// {"image_id", "file_name", "segments_info": [...]}; what is wrong with it goes to `error`.
error_code ParsePanopticAnnotation(sj::object o, CocoPanopticAnnotation* a) {
  bool has_image = false;
  error_code walked = ForEachField(o, [&](std::string_view key, sj::value v) -> error_code {
    if (key == "image_id") {
      has_image = true;
      return GetInt(v, &a->image_id);
    }
    if (key == "file_name") {
      std::string why;
      if (error_code e = GetName(v, &a->file_name, &why, "file_name"); e) {
        if (!why.empty() && a->error.empty()) a->error = why;
        return why.empty() ? e : simdjson::SUCCESS;
      }
      return simdjson::SUCCESS;
    }
    if (key != "segments_info") return simdjson::SUCCESS;
    sj::array segments;
    if (error_code e = v.get_array().get(segments); e) return e;
    for (auto element : segments) {
      sj::object so;
      if (error_code e = element.get_object().get(so); e) return e;
      CocoPanopticSegment seg;
      std::string why;
      if (error_code e = ParsePanopticSegment(so, &seg, &why); e) return e;
      if (!why.empty() && a->error.empty()) a->error = absl::StrCat("segment ", a->segments.size(), ": ", why);
      a->segments.push_back(seg);
    }
    return simdjson::SUCCESS;
  });
  if (walked && !ValueError(walked)) return walked;
  if (!has_image || walked) return simdjson::INCORRECT_TYPE;  // No image to fail: the file is wrong.
  return simdjson::SUCCESS;
}

absl::Status ParseDatasetField(std::string_view key, sj::value v, absl::string_view name, CocoDataset* out,
                               bool* saw_images, bool panoptic) {
  if (key == "annotations" && panoptic) {
    return ForEachObject(v, name, "annotations", [&](sj::object o, size_t i) {
      CocoPanopticAnnotation a;
      if (error_code e = ParsePanopticAnnotation(o, &a); e) {
        return FileError(name, absl::StrCat("annotations[", i, "] (no integer image_id, or not a panoptic annotation)"), e);
      }
      out->panoptic.push_back(std::move(a));
      return absl::OkStatus();
    });
  }
  if (key == "images") {
    *saw_images = true;
    return ParseIdList(v, name, "images", ParseImage, &out->images);
  }
  if (key == "categories") return ParseIdList(v, name, "categories", ParseCategory, &out->categories);
  if (key == "annotations") {
    return ForEachObject(v, name, "annotations", [&](sj::object o, size_t i) {
      CocoAnnotation a;
      std::string why;
      if (error_code e = ParseAnnotation(o, false, &a, &why); e) {
        return why.empty() ? FileError(name, absl::StrCat("annotations[", i, "]"), e)
                           : FieldError(name, absl::StrCat("annotations[", i, "]"), why);
      }
      out->annotations.push_back(std::move(a));
      return absl::OkStatus();
    });
  }
  return absl::OkStatus();
}

absl::StatusOr<CocoDataset> ParseDataset(const simdjson::padded_string_view& json, absl::string_view name,
                                         bool panoptic);
absl::StatusOr<std::vector<CocoAnnotation>> ParseResults(const simdjson::padded_string_view& json,
                                                         absl::string_view name);

// The file with simdjson's padding after it, so that it is parsed where it was read (one copy of
// a large file in memory, not two).
absl::StatusOr<std::string> ReadWhole(const std::string& path, const ClientFileLimits& limits, std::string* sha256) {
  absl::StatusOr<std::string> text = ReadClientFile("COCO file", path, limits, simdjson::SIMDJSON_PADDING);
  if (text.ok() && sha256 != nullptr) *sha256 = Sha256Hex(*text);
  return text;
}

simdjson::padded_string_view Padded(const std::string& text) {
  return simdjson::padded_string_view(text.data(), text.size(), text.capacity());
}

}  // namespace

absl::StatusOr<CocoDataset> ParseCocoDataset(absl::string_view json, absl::string_view name) {
  const simdjson::padded_string padded(json.data(), json.size());
  return ParseDataset(padded, name, false);
}

absl::StatusOr<CocoDataset> ParseCocoPanoptic(absl::string_view json, absl::string_view name) {
  const simdjson::padded_string padded(json.data(), json.size());
  return ParseDataset(padded, name, true);
}

absl::StatusOr<CocoDataset> LoadCocoPanoptic(const std::string& path, const ClientFileLimits& limits,
                                             std::string* sha256) {
  absl::StatusOr<std::string> text = ReadWhole(path, limits, sha256);
  if (!text.ok()) return text.status();
  return ParseDataset(Padded(*text), path, true);
}

namespace {
absl::StatusOr<CocoDataset> ParseDataset(const simdjson::padded_string_view& json, absl::string_view name,
                                         bool panoptic) {
  sj::parser parser;
  sj::document doc;
  if (error_code e = parser.iterate(json).get(doc); e) return FileError(name, "not JSON", e);
  sj::object root;
  if (error_code e = doc.get_object().get(root); e) return FileError(name, "not a JSON object", e);
  CocoDataset out;
  bool saw_images = false;
  for (auto f : root) {
    std::string_view key;
    if (error_code e = f.unescaped_key().get(key); e) return FileError(name, "a key", e);
    sj::value v;
    if (error_code e = f.value().get(v); e) return FileError(name, absl::StrCat("'", absl::string_view(key.data(), key.size()), "'"), e);
    if (absl::Status s = ParseDatasetField(key, v, name, &out, &saw_images, panoptic); !s.ok()) return s;
  }
  if (!saw_images && !panoptic) return FileError(name, "no 'images' list", simdjson::NO_SUCH_FIELD);
  return out;
}
}  // namespace

absl::StatusOr<std::vector<CocoAnnotation>> ParseCocoResults(absl::string_view json, absl::string_view name) {
  const simdjson::padded_string padded(json.data(), json.size());
  return ParseResults(padded, name);
}

namespace {
// The results file in one pass, each detection handed to `each` as it is read (on an error, what
// `each` saw is to be discarded).
absl::Status VisitResults(const simdjson::padded_string_view& json, absl::string_view name,
                          const std::function<void(CocoAnnotation&&)>& each) {
  sj::parser parser;
  sj::document doc;
  if (error_code e = parser.iterate(json).get(doc); e) return FileError(name, "not JSON", e);
  sj::array results;
  if (error_code e = doc.get_array().get(results); e) return FileError(name, "a results file is a JSON list", e);
  int64_t count = 0;
  for (auto element : results) {
    sj::object o;
    if (error_code e = element.get_object().get(o); e) {
      return FileError(name, absl::StrCat("result ", count + 1, " is not an object"), e);
    }
    CocoAnnotation a;
    a.id = ++count;
    std::string why;
    if (error_code e = ParseAnnotation(o, true, &a, &why); e) {
      return why.empty() ? FileError(name, absl::StrCat("result ", a.id), e)
                         : FieldError(name, absl::StrCat("result ", a.id), why);
    }
    each(std::move(a));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CocoAnnotation>> ParseResults(const simdjson::padded_string_view& json,
                                                         absl::string_view name) {
  std::vector<CocoAnnotation> out;
  RETURN_IF_ERROR(VisitResults(json, name, [&](CocoAnnotation&& a) { out.push_back(std::move(a)); }));
  return out;
}
}  // namespace

namespace {
// One detection's JSON text (a view into the whole file, whose padding lies after its end), parsed
// on its own.
error_code ParseOneResult(sj::parser* parser, simdjson::dom::parser* validator, std::string_view text, size_t readable,
                          CocoAnnotation* a, std::string* why) {
  // Valid JSON first (simdjson's DOM parser checks all of it): the on-demand parser below reads
  // lazily, and what it tolerates in skipped values could differ from the whole file's single pass.
  simdjson::dom::element checked;
  if (error_code e = validator->parse(text.data(), text.size(), false).get(checked); e) return e;
  sj::document doc;
  if (error_code e = parser->iterate(simdjson::padded_string_view(text.data(), text.size(), readable)).get(doc); e) {
    return e;
  }
  sj::object o;
  if (error_code e = doc.get_object().get(o); e) return e;
  return ParseAnnotation(o, true, a, why);
}

// Whether `texts` (each a detection's JSON object) tile the document's array: '[', the objects
// separated by single commas, ']', nothing but whitespace between. Anything else (the walk stopped
// early, a value that is no object) leaves the file to the single pass, whose errors are the ones
// Tally has always given.
bool TilesTheArray(std::string_view doc, const std::vector<std::string_view>& texts) {
  auto skip_space = [&](size_t i) {
    while (i < doc.size() && (doc[i] == ' ' || doc[i] == '\t' || doc[i] == '\n' || doc[i] == '\r')) ++i;
    return i;
  };
  size_t at = skip_space(0);
  if (at >= doc.size() || doc[at] != '[') return false;
  at = skip_space(at + 1);
  for (size_t k = 0; k < texts.size(); ++k) {
    if (k > 0) {
      if (at >= doc.size() || doc[at] != ',') return false;
      at = skip_space(at + 1);
    }
    const std::string_view t = texts[k];
    if (t.data() != doc.data() + at || t.size() < 2 || t.front() != '{' || t.back() != '}') return false;
    at = skip_space(at + t.size());
  }
  return at < doc.size() && doc[at] == ']';
}

absl::StatusOr<int> ParseResultsInParts(const simdjson::padded_string_view& json, absl::string_view name, int threads,
                                        const CocoResultVisitor& each, size_t min_per_part) {
  // One thread, or whatever the parts cannot take (a malformed file, for its error): the single pass.
  auto single = [&]() -> absl::StatusOr<int> {
    RETURN_IF_ERROR(VisitResults(json, name, [&](CocoAnnotation&& a) { each(0, std::move(a)); }));
    return 1;
  };
  if (threads <= 1) return single();
  std::vector<std::string_view> texts;
  {
    // First pass: where each detection's text lies (simdjson skips over it without decoding it).
    sj::parser parser;
    sj::document doc;
    sj::array results;
    if (parser.iterate(json).get(doc) || doc.get_array().get(results)) return single();
    for (auto element : results) {
      sj::object o;
      std::string_view text;
      if (element.get_object().get(o) || o.raw_json().get(text)) return single();
      texts.push_back(text);
    }
  }
  if (!TilesTheArray(std::string_view(json.data(), json.size()), texts)) return single();
  const size_t n = texts.size();
  const int parts = static_cast<int>(std::clamp<size_t>(n / std::max<size_t>(min_per_part, 1), 1, static_cast<size_t>(threads)));
  // Parsed part by part first, handed over only once every part has parsed: a malformed detection
  // anywhere hands nothing over and goes to the single pass.
  std::vector<std::vector<CocoAnnotation>> parsed(parts);
  std::atomic<bool> failed{false};
  auto run = [&](size_t part) {
    sj::parser mine;
    simdjson::dom::parser validator;
    std::string why;
    const size_t begin = n * part / parts, end = n * (part + 1) / parts;
    parsed[part].reserve(end - begin);
    for (size_t i = begin; i < end && !failed.load(std::memory_order_relaxed); ++i) {
      CocoAnnotation a;
      a.id = static_cast<int64_t>(i) + 1;
      const size_t readable = static_cast<size_t>(json.data() + json.capacity() - texts[i].data());
      if (ParseOneResult(&mine, &validator, texts[i], readable, &a, &why)) {
        failed.store(true);
        return;
      }
      parsed[part].push_back(std::move(a));
    }
  };
  ParallelFor(parts, parts, run);
  if (failed.load()) return single();
  ParallelFor(parts, parts, [&](size_t part) {
    for (CocoAnnotation& a : parsed[part]) each(static_cast<int>(part), std::move(a));
    std::vector<CocoAnnotation>().swap(parsed[part]);
  });
  return parts;
}
}  // namespace

absl::StatusOr<int> ParseCocoResultsInParts(absl::string_view json, absl::string_view name, int threads,
                                            const CocoResultVisitor& each, size_t min_per_part) {
  const simdjson::padded_string padded(json.data(), json.size());
  return ParseResultsInParts(padded, name, threads, each, min_per_part);
}

absl::StatusOr<int> LoadCocoResultsInParts(const std::string& path, const ClientFileLimits& limits, std::string* sha256,
                                           int threads, const CocoResultVisitor& each, size_t min_per_part) {
  absl::StatusOr<std::string> text = ReadWhole(path, limits, sha256);
  if (!text.ok()) return text.status();
  return ParseResultsInParts(Padded(*text), path, threads, each, min_per_part);
}

absl::StatusOr<CocoDataset> LoadCocoDataset(const std::string& path, const ClientFileLimits& limits,
                                            std::string* sha256) {
  absl::StatusOr<std::string> text = ReadWhole(path, limits, sha256);
  if (!text.ok()) return text.status();
  return ParseDataset(Padded(*text), path, false);
}

absl::StatusOr<std::vector<CocoAnnotation>> LoadCocoResults(const std::string& path, const ClientFileLimits& limits,
                                                            std::string* sha256) {
  absl::StatusOr<std::string> text = ReadWhole(path, limits, sha256);
  if (!text.ok()) return text.status();
  return ParseResults(Padded(*text), path);
}

absl::StatusOr<Rle> SegmentationRle(const CocoSegmentation& s, int64_t height, int64_t width, int64_t max_bytes) {
  switch (s.kind) {
    case CocoSegmentation::Kind::kNone:
      return absl::InvalidArgumentError("no segmentation");
    case CocoSegmentation::Kind::kPolygons:
      return RleFromPolygons(s.polygons, height, width, max_bytes);
    case CocoSegmentation::Kind::kCounts:
    case CocoSegmentation::Kind::kString:
      break;
  }
  if (s.height != height || s.width != width) {
    return absl::InvalidArgumentError(absl::StrCat("segmentation size ", s.height, " x ", s.width,
                                                   " is not the image's ", height, " x ", width));
  }
  if (s.kind == CocoSegmentation::Kind::kCounts) return RleFromCounts(s.counts, height, width);
  return RleFromString(s.counts_string, height, width);
}

std::vector<std::string> CocoImageColumns(const std::vector<CocoImageInfo>& images) {
  std::vector<std::string> out = {"width", "height"};
  std::set<std::string> seen(out.begin(), out.end());
  for (const CocoImageInfo& im : images) {
    for (const auto& [k, v] : im.fields) {
      if (out.size() < 64 && seen.insert(k).second) out.push_back(k);
    }
  }
  return out;
}

std::vector<std::string> CocoImageValues(const CocoImageInfo& im, const std::vector<std::string>& columns) {
  std::vector<std::string> out(columns.size());
  out[0] = absl::StrCat(im.width);
  out[1] = absl::StrCat(im.height);
  for (const auto& [k, v] : im.fields) {
    const auto at = std::find(columns.begin(), columns.end(), k);
    if (at != columns.end()) out[at - columns.begin()] = v;
  }
  return out;
}

}  // namespace tally
